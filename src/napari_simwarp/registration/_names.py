"""The names the optimizer accepts, in a module without torch (the CLI's parser uses them)."""

MODELS = ("translation", "rigid", "similarity", "affine", "deformable", "diffeomorphic")
LINEAR_MODELS = MODELS[:4]
METRICS = ("ncc", "lncc", "ssim", "mse", "mi")
#: the metric of ``metric=None`` per model, chosen by measurement (docs/benchmarks.md,
#: "Registration quality"): global NCC for linear models (more accurate and about twice
#: as fast as local NCC on the suite's cases) and for the deformable model's B-spline
#: field (issue 16: end-point error on three draws of each 2-D dense case of
#: benchmarks/bench_quality.py, local σ 8 px: mean 0.067 px against local NCC's 0.070 with
#: its best bending weight; a pair whose intensities differ locally wants "lncc"),
#: local NCC for the diffeomorphic one
DEFAULT_METRICS = {m: ("ncc" if m in LINEAR_MODELS else "lncc") for m in MODELS}
DEFAULT_METRICS["deformable"] = "ncc"


#: the metrics that take a ``window``
WINDOWED_METRICS = ("lncc", "ssim")


def default_metric(model: str, metric: str | None = None, window=None) -> str | None:
    """``metric``, or the model's default when it is None (an unknown model: None).

    A ``window`` given without a metric, for a model whose default metric takes none
    (the deformable model's global NCC since issue 16), is refused with a TypeError that
    says which metric to ask for: the window would otherwise be an error about a metric
    the caller never named.
    """
    if metric is not None:
        return metric
    chosen = DEFAULT_METRICS.get(model)
    if window is not None and chosen is not None and chosen not in WINDOWED_METRICS:
        raise TypeError(
            f"window={window!r} was given without a metric, and the {model} model's default "
            f"metric {chosen!r} (global) takes no window: pass metric='lncc' (local NCC; "
            "--metric lncc on the command line) to use a window, or leave the window out"
        )
    return chosen
