"""Built-in plugin: the efficientvit model-family adapter (issue 4; being written)."""
