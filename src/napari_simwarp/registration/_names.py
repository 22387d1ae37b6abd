"""The names the optimizer accepts, in a module without torch (the CLI's parser uses them)."""

MODELS = ("translation", "rigid", "similarity", "affine", "deformable", "diffeomorphic")
LINEAR_MODELS = MODELS[:4]
METRICS = ("ncc", "lncc", "ssim", "mse", "mi")
#: the metric of ``metric=None`` per model, chosen by measurement (docs/benchmarks.md,
#: "Registration quality"): global NCC for linear models (more accurate and about twice
#: as fast as local NCC on the suite's cases); local NCC for the dense models. Global NCC
#: gave the deformable model's B-spline field 2 to 3 % lower end-point errors on pairs
#: that share their intensities, but under an illumination that varies across the image
#: by as little as ±5 % it folded the field (errors of 1.5 to 75 px; issue 16), where
#: local NCC stayed within 0.08 px.
DEFAULT_METRICS = {m: ("ncc" if m in LINEAR_MODELS else "lncc") for m in MODELS}


#: the metrics that take a ``window``
WINDOWED_METRICS = ("lncc", "ssim")


def default_metric(model: str, metric: str | None = None, window=None) -> str | None:
    """``metric``, or the model's default when it is None (an unknown model: None).

    A ``window`` given without a metric, for a model whose default metric takes none
    (the linear models' global NCC), is refused with a TypeError that
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
