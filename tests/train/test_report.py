"""What a run reports (train/report.py): PyTorch's vmap fallback warning worded as PyTorch's.
The epoch lines themselves are checked where runs make them (tests/train/test_train.py,
tests/train/test_train_fit_many.py)."""

import fastload.train


def test_pytorchs_vmap_fallback_warning_is_explained_in_fastloads_words():
    torch_says = (
        "There is a performance drop because we have not yet implemented the batching rule for "
        "aten::scatter_.value. Please file us an issue on GitHub so that we can prioritize its "
        "implementation. (Triggered internally at BatchedFallback.cpp:82.)"
    )
    explained = fastload.train.explain_warning(torch_says)
    assert explained.startswith("stacked runs: PyTorch's vmap has no batched kernel for aten::scatter_.value")
    assert "file us an issue" not in explained and "not to fastload" in explained
    assert fastload.train.explain_warning("something else") == "something else"
