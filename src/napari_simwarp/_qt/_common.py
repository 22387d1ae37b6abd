"""Helpers shared by the widgets: result layers by name, notifications, backend label."""

from __future__ import annotations

import contextlib
import sys
import threading
import time
import weakref

import numpy as np
from magicgui.widgets import CheckBox, ComboBox, Container, Label
from napari.utils.notifications import show_error, show_info, show_warning

from ..widgets_logic.device import resolve_device


def notify_error(what: str, exc: BaseException) -> None:
    """One clear line in a napari notification (no bare traceback)."""
    msg = str(exc).strip() or type(exc).__name__
    show_error(f"napari-simwarp: {what} failed: {msg}")


def notify_info(msg: str) -> None:
    show_info(f"napari-simwarp: {msg}")


def notify_warning(msg: str) -> None:
    show_warning(f"napari-simwarp: {msg}")


def layer_by_name(viewer, name: str):
    return viewer.layers[name] if name in viewer.layers else None  # noqa: SIM401 (LayerList has no .get)


def keep_on_top(viewer, layers, seen: set) -> None:
    """Move ``layers`` (result layers a rerun reused, in this order) above every other
    layer when one was added over them since the last display, which hid them (issue 13).

    ``seen`` (the widget's ``_seen_layers``, updated here): the ids of the viewer's layers
    at the last display; a layer over the results that was there then was put there by
    the user, and stays.
    """
    stack = viewer.layers
    top = stack.index(layers[0]) if all(layer in stack for layer in layers) else len(stack)
    if any(id(layer) not in seen for layer in list(stack)[top:] if layer not in layers):
        for layer in layers:
            stack.move(stack.index(layer), len(stack))
    seen.clear()
    seen.update(id(layer) for layer in stack)


def put_layer(viewer, kind: str, name: str, data, like=None, **props):
    """Reuse the layer called ``name`` (``layer.data = data``) or add one of ``kind``.

    ``like``: an input layer whose ``scale`` and ``translate`` the result takes (for
    results on the input's grid). A layer of another type or dimensionality under that
    name is replaced.
    """
    layer = layer_by_name(viewer, name)
    ndim = _ndim(kind, data)
    geometry = {}
    if like is not None and like.ndim == ndim:
        geometry = {"scale": like.scale, "translate": like.translate}
    if layer is None or not same_kind(layer, kind, data):
        if layer is not None:
            remove_layer(viewer, name)
        with added_unselected(viewer):  # napari selects each layer it adds
            adder = getattr(viewer, f"add_{kind}")
            return adder(data, name=name, **geometry, **props)
    features = props.pop("features", None)
    if kind == "shapes":
        layer.data = (list(data), [props.pop("shape_type", "rectangle")] * len(data))
    else:
        layer.data = data
    if features is not None:
        layer.features = features
    for key, value in {**geometry, **props}.items():
        # Each property set refreshes the layer (a vectors thumbnail is a Python loop per
        # arrow): set only what differs.
        if _differs(getattr(layer, key, None), value):
            setattr(layer, key, value)
    return layer


def redraw_in_place(layer, data) -> bool:
    """Copy ``data`` into ``layer.data`` (an array of the same shape) and redraw the layer's
    slice on the canvas only: no thumbnail (a Vectors thumbnail is a Python loop per
    arrow), no extent, no ``data`` event (each one re-emits through the layer list's Qt
    model and recomputes the viewer's dims). For a live display of many updates that
    ends with a plain ``layer.data = ...``. False (nothing done) when ``layer.data`` is
    not a writable NumPy array of ``data``'s shape."""
    target = layer.data
    if not (
        isinstance(target, np.ndarray)
        and isinstance(data, np.ndarray)
        and target.shape == data.shape
        and target.flags.writeable
    ):
        return False
    np.copyto(target, data, casting="same_kind")
    try:
        layer.refresh(thumbnail=False, extent=False, highlight=False)
    except TypeError:  # napari before these keywords: a whole refresh
        layer.refresh()
    return True


def _differs(current, value) -> bool:
    """Whether a layer property holding ``current`` must be set to ``value``: a colormap
    compares by name, per-item colours with the colour named, arrays by their values,
    anything not comparable differs."""
    current = getattr(current, "name", current) if isinstance(value, str) else current
    try:
        if isinstance(value, str) and isinstance(current, np.ndarray):  # edge colours
            from napari.utils.colormaps.standardize_color import transform_color

            return not (current.size and np.allclose(current, transform_color(value)[0]))
        if isinstance(current, str) or isinstance(value, str):
            return str(getattr(current, "value", current)) != value
        return not np.array_equal(np.asarray(current), np.asarray(value))
    except (TypeError, ValueError):
        return True


def same_kind(layer, kind: str, data) -> bool:
    """Whether ``layer`` is a ``kind`` layer ("image", "vectors"...) that can take ``data``
    (same dimensionality)."""
    # isinstance, not the type's name: docked from the Plugins menu, a widget's layers are
    # napari's PublicOnlyProxy (``type(layer)`` is the proxy; ``isinstance`` sees through
    # it), and a name compare replaced every result layer at each display (issue 27).
    # Nor napari's private ``_type_string`` (a FutureWarning on each use).
    import napari.layers

    cls = getattr(napari.layers, kind.capitalize(), None)
    return (
        layer is not None
        and cls is not None
        and isinstance(layer, cls)
        and layer.ndim == _ndim(kind, data)
    )


@contextlib.contextmanager
def selection_kept(viewer):
    """Restore the user's layer selection after adding or removing layers inside the
    ``with`` block: napari makes each added layer the selected one, and a result layer
    taking the selection at every run took the layer the user was working on (issue 27).
    Only what changed is put back (added first, then removed: the selection is never
    empty in between, which would swap napari's layer controls twice)."""
    selection = viewer.layers.selection
    before = set(selection)
    try:
        yield
    finally:
        now = set(selection)
        kept = {layer for layer in before if layer in viewer.layers}
        if now != kept:
            if kept - now:
                selection.update(kept - now)
            if now - kept:
                selection.difference_update(now - kept)


@contextlib.contextmanager
def added_unselected(viewer):
    """Add layers inside the ``with`` block without changing the layer selection, not
    even for a moment: napari makes each added layer the only selected one, and each
    selection change repopulates its layer controls and the layer list's selection
    (15-40 ms of the GUI thread under software OpenGL, twice: selected, then put back by
    :func:`selection_kept`). Here the selection's events are blocked while the layers
    are added and the selection is put back before they are unblocked: nothing listening
    sees a change, and the selection they show is the one restored (issue 27: a run
    never changes the user's selection).

    For additions only (a removal of a selected layer must tell the listeners, see
    :func:`selection_kept`). With several layers selected, napari's "current" one among
    them (its private ``_current``) is not restored: the set is.
    """
    selection = viewer.layers.selection
    before = set(selection)
    with selection.events.blocker_all():
        try:
            yield
        finally:
            if set(selection) != before:
                selection.clear()  # then the same layers as before, active as before
                selection.update(layer for layer in before if layer in viewer.layers)


def show_colorbar(layer) -> None:
    """Show napari's colour bar of an image layer (a map's values, e.g. ZNCC from -1 to
    1, read off beside it); nothing where this napari has none."""
    with contextlib.suppress(AttributeError):
        layer.colorbar.visible = True


def remove_layer(viewer, name: str) -> None:
    """Remove the result layer called ``name``, if there is one (a run that produces no data
    for it must not leave an earlier run's layer behind, looking current)."""
    layer = layer_by_name(viewer, name)
    if layer is not None:
        with selection_kept(viewer):
            viewer.layers.remove(layer)


def _ndim(kind: str, data) -> int:
    if kind in ("image", "labels"):
        # the shape alone: np.asarray would compute a lazy (dask) result whole, here on
        # the GUI thread
        return len(np.shape(data))
    a = np.asarray(data)
    if kind == "vectors":
        return a.shape[-1]
    if kind == "points":
        return a.shape[1]
    if kind == "shapes":
        return a.shape[-1] if len(a) else 2
    return a.ndim


def layer_image(layer, name: str) -> np.ndarray:
    """An image layer's data as an array-like (RGB turned to luminance)."""
    from ..widgets_logic._arrays import rgb_to_gray

    if layer is None:
        raise ValueError(f"choose a {name} layer")
    data = layer.data
    if getattr(layer, "multiscale", False):
        data = data[0]
    return rgb_to_gray(data) if getattr(layer, "rgb", False) else data


def plane_geometry(layer, src) -> dict:
    """Scale and translate of a result computed on a plane of ``layer`` (a
    :class:`~napari_simwarp.widgets_logic.planes.PlaneSource`'s spatial axes; a multiscale
    level's pixels are ``factors`` full-resolution pixels wide)."""
    if layer is None:
        return {}
    d = src.d
    scale = np.asarray(layer.scale)[-d:] * np.asarray(src.factors[-d:])
    return {"scale": scale, "translate": np.asarray(layer.translate)[-d:]}


def on_its_plane(layer, plane, data: np.ndarray) -> tuple[np.ndarray, dict]:
    """A map computed on ``plane`` (a :class:`~napari_simwarp.widgets_logic.planes.Plane`
    of ``layer``: spatial ``S`` at ``plane.index`` of the leading axes ``L``) placed where
    it belongs in the viewer: ``data`` (``S``) as a view ``(1, ..., 1, *S)`` with one axis
    per leading axis of ``layer``, and the scale and translate that put it at that plane.

    napari then shows it on that plane only: on any other frame or plane the layer's
    slice is empty, so a map of frame t is never shown as the map of the frame the
    viewer is on (issue 27: during playback, a map of an earlier frame stayed on screen
    for the debounce and computation of the next). ``({data: ...}, {scale, translate})``
    of ``layer``'s dimensionality; ``data`` unchanged and ``plane_geometry`` for a layer
    without leading axes.
    """
    src = plane.source
    geometry = plane_geometry(layer, src)
    lead = len(plane.index)
    if layer is None or lead == 0 or layer.ndim != lead + src.d:
        return data, geometry
    factors = np.asarray(src.factors[:lead], dtype=float)
    scale = np.asarray(layer.scale)[:lead] * factors
    translate = np.asarray(layer.translate)[:lead] + np.asarray(plane.index) * scale
    view = data.reshape((1,) * lead + data.shape)
    return view, {
        "scale": np.concatenate([scale, geometry["scale"]]),
        "translate": np.concatenate([translate, geometry["translate"]]),
    }


def level_choice(layer, spin, d: int) -> None:
    """Show ``spin`` (a level SpinBox) for a multiscale ``layer`` only, with its levels as
    the range and, as the value, the first level whose ``d``-D plane holds at most 2048²
    pixels (the user may change it)."""
    multiscale = bool(getattr(layer, "multiscale", False))
    spin.visible = multiscale
    if multiscale:
        levels = list(layer.data)
        sizes = [np.prod(lv.shape[layer.ndim - d : layer.ndim]) for lv in levels]
        fits = [i for i, n in enumerate(sizes) if n <= 2048 * 2048]
        with spin.changed.blocked():
            spin.max = len(levels) - 1
            spin.value = fits[0] if fits else len(levels) - 1


class BackendLabel(Label):
    """Shows "device: … · kernels: …". Cheap (it never triggers a build); widgets call
    :meth:`refresh` after each computation, when the kernels have been loaded."""

    def __init__(self, device_getter):
        super().__init__(value="")
        self._device_getter = device_getter
        self.refresh()

    def refresh(self, *_) -> None:
        from ..widgets_logic.device import describe_backend

        try:
            self.value = describe_backend(self._device_getter())
        except Exception as exc:  # a bad device name: say so, do not break the widget
            self.value = f"device: ? ({exc})"
            return
        seconds = _KERNEL_BUILD["seconds"]
        # the build's time apart from any computation's (issue 13), where it built them
        if seconds is not None and "kernels: compiled" in self.value:
            self.value += f" (loaded in {seconds:.1f} s)"


#: workers started by :func:`start_worker` and not yet ended -> a callable that asks
#: their computation to end early (None: it cannot be interrupted)
_RUNNING: dict = {}


def start_worker(worker, stop=None) -> None:
    """Start ``worker`` and note, from its own thread, when it has ended (see
    :func:`wait_for`). ``stop``: a callable that makes the computation end early (a
    registration's :meth:`~..widgets_logic.registration.RegistrationRun.abort`), used
    if Python exits while the worker runs (:func:`end_workers_at_exit`)."""

    from qtpy.QtCore import Qt

    done = threading.Event()

    def ended():
        if not done.is_set():
            done.set()
            _RUNNING.pop(worker, None)
            _switch_interval(-1)

    # Direct: set in the worker's thread as it finishes, even while the GUI thread is
    # busy closing (a queued signal would wait for the event loop).
    worker.finished.connect(ended, type=Qt.ConnectionType.DirectConnection)
    worker._simwarp_done = done
    worker._simwarp_ended = ended  # for a worker taken out of the pool before it ran
    if not _RUNNING:
        _register_exit_hook()
    _RUNNING[worker] = stop
    _switch_interval(+1)
    worker.start()


#: the interpreter's GIL switch interval (s) while a widget's worker runs (CPython's
#: default: 0.005). A worker's torch calls each release the GIL and take it back; while
#: the GUI thread runs Python (napari's layer updates, repaints), each take waited for
#: the GUI thread to give the GIL up, which it does after the switch interval: a
#: registration's worker ran 1.5-2.5x its CPU time (issue 27). With 0.5 ms, in a shown
#: viewer from the Plugins menu under load 3.5 (3 alternations each): affine first runs
#: 0.91-1.48 s against 1.39-1.75 s, warm 0.58-0.79 s against 0.66-1.13 s, longest GUI
#: pauses 57-113 ms against 102-166 ms; deformable first runs 2.57-2.97 s against
#: 3.15-3.53 s (load 4-4.5).
WORKER_SWITCH_INTERVAL = 0.0005
_SWITCH: dict = {"workers": 0, "saved": None}
_SWITCH_LOCK = threading.Lock()


def _switch_interval(change: int) -> None:
    """Count a worker started (+1) or ended (-1); while any runs, the interpreter's switch
    interval is :data:`WORKER_SWITCH_INTERVAL` (or the one set before, if shorter), and
    when the last one ends it is put back to what it was."""
    with _SWITCH_LOCK:
        workers = max(0, _SWITCH["workers"] + change)
        _SWITCH["workers"] = workers
        if workers and _SWITCH["saved"] is None:
            _SWITCH["saved"] = sys.getswitchinterval()
            sys.setswitchinterval(min(_SWITCH["saved"], WORKER_SWITCH_INTERVAL))
        elif not workers and _SWITCH["saved"] is not None:
            sys.setswitchinterval(_SWITCH["saved"])
            _SWITCH["saved"] = None


#: the widgets' background threads (warm-ups) not yet ended: joined (bounded) at exit
_BACKGROUND: weakref.WeakSet = weakref.WeakSet()


def run_in_background(function, name: str):
    """Start ``function()`` in a daemon thread that Python's exit waits for (bounded,
    :func:`end_workers_at_exit`): a daemon thread still importing a C extension (torch's)
    while the interpreter is torn down can abort the process."""
    thread = threading.Thread(target=function, name=name, daemon=True)
    _BACKGROUND.add(thread)
    _register_exit_hook()
    thread.start()
    return thread


def _join_background(seconds: float) -> None:
    deadline = time.monotonic() + seconds
    for thread in list(_BACKGROUND):
        thread.join(max(0.0, deadline - time.monotonic()))


def _register_exit_hook() -> None:
    import atexit

    atexit.unregister(end_workers_at_exit)  # once
    atexit.register(end_workers_at_exit)


def end_workers_at_exit(seconds: float = 5.0) -> None:
    """Ask every worker still running to end and wait (bounded) until they have, then tear
    down the widgets still open (:func:`tear_down_widgets`).

    Run by :mod:`atexit` when a script leaves Python (its end, ``sys.exit`` or an
    exception) while a widget computes: a worker thread still running Python while the
    interpreter and Qt's objects are torn down crashed the process (exit 139, or an
    abort on "WorkerBaseSignals has been deleted"). Registered after Qt's own exit
    handlers, it runs before them.
    """
    _end_workers(seconds)
    _join_background(seconds)
    tear_down_widgets()


def _end_workers(seconds: float) -> None:
    import time

    workers = list(_RUNNING.items())
    for worker, stop in workers:
        with contextlib.suppress(Exception):
            if stop is not None:
                stop()
            worker.quit()
    deadline = time.monotonic() + seconds
    for worker, _ in workers:
        done = getattr(worker, "_simwarp_done", None)
        if done is not None:
            done.wait(max(0.0, deadline - time.monotonic()))


#: the widgets made in this process (weakly held), torn down at exit
_WIDGETS: weakref.WeakSet = weakref.WeakSet()


def tear_down_widgets(widgets=None) -> None:
    """Run the teardown of every open widget (or of ``widgets``: its ``destroyed``
    callback, which stops its timers, progress bars, registration and worker) and delete
    its Qt objects now, while Python is whole; run at exit (:func:`end_workers_at_exit`).

    Otherwise PyQt's own exit handler deletes them: it walks sip's table of every Python
    wrapper and deletes each parentless QObject in turn, and the Python that their
    deletion runs (these callbacks closing napari's progress bars, magicgui's event
    filters) frees and creates wrappers in that table mid-walk, which crashed the process
    in the walk about one exit in four (exit 139 in ``cleanup_qobject`` from
    ``sip_api_visit_wrappers``; a script that left with the Register, drift correction,
    similarity and template matching widgets open and computing).
    """
    widgets = list(_WIDGETS if widgets is None else widgets)
    if not widgets:
        return
    from qtpy.QtCore import QCoreApplication, QEvent

    for w in widgets:
        teardown = getattr(w, "_teardown", None)
        with contextlib.suppress(Exception):  # one widget's failure must not keep the rest
            if teardown is not None:
                teardown()
    for w in widgets:
        # Its Qt objects may be deleted already (RuntimeError), its callback disconnected
        # by an earlier call (TypeError).
        with contextlib.suppress(RuntimeError, TypeError):
            if getattr(w, "_teardown", None) is not None:
                w.native.destroyed.disconnect(w._teardown)
        with contextlib.suppress(RuntimeError):
            w.native.deleteLater()
    if QCoreApplication.instance() is not None:
        QCoreApplication.sendPostedEvents(None, QEvent.Type.DeferredDelete)  # delete now


def wait_for(worker, msecs: int = 10000) -> None:
    """Block (bounded) until ``worker`` has left its thread; used when the viewer closes,
    so that no worker outlives the widgets it reports to. A worker still queued in the
    thread pool (two cores run two at a time) is taken out: it will never start. Only
    this worker is waited for, not every worker of the pool (the others' widgets may not
    have asked theirs to stop yet)."""
    from qtpy.QtCore import QThreadPool

    if worker is None:
        return
    pool = QThreadPool.globalInstance()
    with contextlib.suppress(RuntimeError):  # a finished worker may be deleted already
        if pool.tryTake(worker):
            ended = getattr(worker, "_simwarp_ended", None)
            if ended is not None:
                ended()  # it will never run, nor say it ended
            # nor leave superqt's set of started workers (it leaves on finishing): a
            # teardown that waits for that set to empty would wait for ever
            discard = getattr(type(worker), "_set_discard", None)
            if discard is not None:
                discard(worker)
            return
    done = getattr(worker, "_simwarp_done", None)
    if done is not None:
        done.wait(msecs / 1000)
    else:
        pool.waitForDone(msecs)


def device_choices() -> list[str]:
    """The device names a widget offers: "auto", then the devices torch can use here."""
    from .._devices import available_devices

    return available_devices()


def on_destroyed(widget, stop=None):
    """A callback for the native widget's ``destroyed`` signal, acting once.

    Marks the widget closed, calls ``stop(widget)`` for what only that widget runs (a
    refresh timer, a registration), then quits its worker and waits (bounded) for it, so
    no worker outlives the widget it reports to. Touches none of the widget's Qt objects:
    they are being destroyed.
    """
    state = {"w": widget}

    def close(*_):
        w = state.pop("w", None)
        if w is None:
            return
        w._closed = True
        if stop is not None:
            stop(w)
        if w._worker is not None:
            w._worker.quit()
            wait_for(w._worker)

    return close


#: the one kernel build every widget waits on: its worker and the callbacks to run after
#: and how long it took (None until one ends), shown by every widget's kernel label
_KERNEL_BUILD: dict = {"worker": None, "waiters": [], "seconds": None}


def kernels_pending() -> bool:
    """Whether the compiled kernels have not been built or loaded yet (cheap)."""
    from ..ops import _kernels

    try:
        return _kernels.requested_backend() != "torch" and not _kernels.state()["tried"]
    except ValueError:  # a bad SIMWARP_BACKEND: the operators will say so
        return False


def after_kernel_build(widget, then, device="auto") -> bool:
    """True when the kernels are ready, when ``device`` does not run them (they are CPU
    and CUDA kernels: Apple's MPS takes the torch path) or when the user chose the pure
    torch operators while they build (:func:`torch_while_building`); otherwise start
    (once, shared by every widget) their build off the GUI thread with a napari progress
    bar, say so in ``widget``'s status line and call ``then()`` when it is done (unless
    the widget closed meanwhile)."""
    from ..ops import _kernels

    if not kernels_pending():
        return True
    try:
        if resolve_device(device).type not in _kernels.KERNEL_DEVICE_TYPES:
            return True
    except ValueError:
        return True  # a bad device: the run itself says so, without a build first
    _start_kernel_build()
    if torch_while_building():
        return True  # the operators take the torch path until the build ends
    # A cached build loads in under a second: "about a minute" only when it is still
    # going after one (it flashed on every cached load, issue 27).
    widget._status.value = "loading the compiled kernels…"
    _KERNEL_BUILD["waiters"].append((widget, then))

    def still_building():
        if _KERNEL_BUILD["worker"] is not None and not widget._closed:
            widget._status.value = (
                "building the compiled kernels (first use only; about a minute; or tick "
                "'pure torch until built')…"
            )

    from qtpy.QtCore import QTimer

    QTimer.singleShot(1000, still_building)
    return False


def torch_while_building(on: bool | None = None) -> bool:
    """Whether the widgets compute with the pure torch operators until the kernels are
    loaded (slower, at once) rather than wait for the build; ``on`` sets it, for every
    widget, and releases those waiting. Shown as a check box while the kernels are not
    loaded."""
    from ..ops import _kernels

    if on is None:
        return _kernels.torch_until_loaded()
    _kernels.torch_until_loaded(on)
    for w in list(_WIDGETS):  # one setting: every open widget's box shows it
        if not w._closed:  # a closed widget's Qt objects may be gone
            with w._torch_meanwhile.changed.blocked():
                w._torch_meanwhile.value = on
    if on:
        waiters, _KERNEL_BUILD["waiters"] = _KERNEL_BUILD["waiters"], []
        for w, callback in waiters:
            if not w._closed:
                w._status.value = "pure torch operators until the kernels are built"
                callback()
    return on


def kernels_cached() -> bool:
    """Whether this machine holds a build of the CPU kernels for these sources (then
    loading them takes about a second, not a minute's build). False on any doubt."""
    try:
        from ..ops._kernels import _build

        files = _build.sources("cpu")
        directory = _build.build_directory("cpu", files, _build.host_cflags())
        return any(directory.glob("simwarp_ops_cpu*.so"))
    except Exception:
        return False


def preload_kernels() -> None:
    """Load the compiled kernels in the background as a widget opens, where a build is
    cached (about a second, which the first run waited for, issue 27); a first build (a
    minute of both cores) still waits for a run to ask for it."""
    if kernels_pending() and _KERNEL_BUILD["worker"] is None and kernels_cached():
        _start_kernel_build()


def _start_kernel_build() -> None:
    """Start the one kernel build or load (unless under way) in a worker; a build (not a
    cached load) with napari's progress bar."""
    from napari.qt.threading import create_worker

    from ..ops import _kernels

    if _KERNEL_BUILD["worker"] is not None:
        return
    started = time.perf_counter()

    def done(*_):
        _KERNEL_BUILD["worker"] = None
        _KERNEL_BUILD["seconds"] = time.perf_counter() - started
        waiters, _KERNEL_BUILD["waiters"] = _KERNEL_BUILD["waiters"], []
        for w in list(_WIDGETS):  # every open widget's label, not only the waiters'
            if not w._closed:
                w._backend.refresh()
                w._torch_meanwhile.visible = False  # nothing to wait for any more
        for w, callback in waiters:
            if not w._closed:
                w._status.value = "kernels ready"
                callback()

    # napari's progress bar for a build only (a minute): a cached build loads in about a
    # second, as a widget opens, and the session's first napari progress bar took 150-400
    # ms of the GUI thread to make (its activity dialog), a pause at the dock or at a first
    # click soon after it (issue 27); waiting widgets say it in their status line.
    bar = {} if kernels_cached() else {"total": 0, "desc": "Building napari-simwarp kernels"}
    worker = create_worker(_kernels.ensure_loaded, _ignore_errors=True, _progress=bar or None)
    worker.errored.connect(lambda exc: notify_error("building the kernels", exc))
    worker.finished.connect(done)
    _KERNEL_BUILD["worker"] = worker
    start_worker(worker)


class WorkerWidget(Container):
    """A widget that runs one background worker at a time and reports its errors.

    Subclasses set :attr:`task` (named in error messages) and place the controls every
    widget has, made here: ``self._device`` (the device choice, public as ``device``),
    ``self._status`` (a Label) and ``self._backend`` (a :class:`BackendLabel` that follows
    the device).
    """

    #: what the widget does, for messages ("template matching failed: ...")
    task = "computation"

    def __init__(self):
        from qtpy.QtWidgets import QSizePolicy

        from .._threads import leave_a_core_for_the_viewer

        super().__init__()
        leave_a_core_for_the_viewer()  # the GUI thread's, while a worker computes
        self._worker = None
        self._closed = False
        self._teardown = None  # the destroyed callback (watch_destroyed), also run at exit
        self._seen_layers: set = set()  # the viewer's layers at the last display (keep_on_top)
        _WIDGETS.add(self)
        _register_exit_hook()
        self._device = ComboBox(
            name="device", choices=device_choices(), value="auto", label="device"
        )
        self._status = Label(value="")  # wraps: whole error messages, not cut at the edge
        self._backend = BackendLabel(lambda: self._device.value)
        for label in (self._status, self._backend):
            # a long line wraps at the dock's width and never widens it (a wrapped
            # QLabel still asks for a width of its own, here 400 px)
            label.native.setWordWrap(True)
            label.native.setSizePolicy(QSizePolicy.Policy.Ignored, QSizePolicy.Policy.Preferred)
        self._device.changed.connect(self._backend.refresh)
        # Shown while the kernels are not loaded: compute at once with the torch operators
        # instead of waiting for the first build (about a minute; issue 13).
        self._torch_meanwhile = CheckBox(
            value=torch_while_building(), text="pure torch until built"
        )
        self._torch_meanwhile.tooltip = (
            "Compute with the pure torch operators (slower) until the compiled kernels "
            "are built (first use only, about a minute), instead of waiting"
        )
        if not kernels_pending():  # (made visible before its parent, it would be a window)
            self._torch_meanwhile.visible = False
        self._torch_meanwhile.changed.connect(torch_while_building)
        preload_kernels()

    def compact(self) -> None:
        """Keep the dock narrow (issue 27: 660 px of a 1500 px window, the image opened
        cropped; napari-animation and affinder take about 350 px): a combo box asks for
        the width of a few characters, not of its longest choice (a layer's long name);
        the whole text shows in its list."""
        from qtpy.QtWidgets import QComboBox

        for combo in self.native.findChildren(QComboBox):
            combo.setSizeAdjustPolicy(
                QComboBox.SizeAdjustPolicy.AdjustToMinimumContentsLengthWithIcon
            )
            combo.setMinimumContentsLength(10)

    def watch_destroyed(self, stop=None) -> None:
        """When the native widget is destroyed (or Python exits first), mark the widget
        closed, call ``stop(self)`` and end its worker (:func:`on_destroyed`)."""
        self._teardown = on_destroyed(self, stop)
        self.native.destroyed.connect(self._teardown)

    def _on_error(self, exc):
        """The whole message in the status label (a toast cuts long ones) and a toast."""
        if self._closed:  # a worker's last word after the close: its widget is gone
            return
        msg = str(exc).strip() or type(exc).__name__
        self._status.value = f"error: {msg}"
        notify_error(self.task, exc)

    def _on_finished(self):
        self._worker = None
        if not self._closed:
            self._backend.refresh()

    @property
    def busy(self) -> bool:
        """Whether a worker is running."""
        return self._worker is not None
