"""The names the optimizer accepts, in a module without torch (the CLI's parser uses them)."""

MODELS = ("translation", "rigid", "similarity", "affine", "deformable", "diffeomorphic")
LINEAR_MODELS = MODELS[:4]
METRICS = ("ncc", "lncc", "ssim", "mse", "mi")
