"""norm-drop passes vitbench's conformance check (shapes, token counts, prefix rule, determinism)."""


def test_norm_drop_conforms(vitbench_check_method):
    vitbench_check_method("norm-drop")
