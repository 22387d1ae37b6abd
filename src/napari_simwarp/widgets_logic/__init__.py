"""The widgets' models: pure logic with no Qt and no napari (napari-animation's split).

Each widget in :mod:`napari_simwarp._qt` is a thin view over one of these modules, which
call the same public functions a script calls (:mod:`napari_simwarp.ops`,
:mod:`napari_simwarp.register`) and return NumPy arrays shaped for napari layers:

- :mod:`.similarity`: similarity maps with request ids (stale results are dropped),
  colormaps and contrast limits per metric, cached input tensors;
- :mod:`.matching`: template from a rectangle, ZNCC map, top-k peaks with non-maximum
  suppression;
- :mod:`.registration`: a registration run as a generator of display snapshots (warped
  image, loss curve, subsampled displacement and similarity-gradient vectors), pairs, 3D
  and time-lapse stacks;
- :mod:`.vectors`: dense fields to napari Vectors data ``(n, 2, D)``;
- :mod:`.device`: device choice and a one-line description of the kernel backend.
"""
