"""Built-in plugin: the mobilevit model-family adapter (issue 4; being written)."""
