"""``fit``: ``partial_fit`` over views, sequences and loaders, for epochs or steps, with validation and progress."""

from __future__ import annotations

import inspect
import itertools
from collections.abc import Callable, Iterable, Iterator, Sized
from typing import Any, TypeVar

from ..arguments import integer
from ..loading.buffers import BufferLoader
from ..progress import ProgressBar, progress_bar
from ..views.base import View
from ..views.sources import sized_view
from .items import FeatureLayout, fields
from .scoring import check_metric, score, score_rule

__all__ = ["fit"]

Estimator = TypeVar("Estimator")  # fit returns the estimator it trains, whatever its type


def fit(
    estimator: Estimator,
    batches: Iterable[Any],
    classes: Any = None,
    epochs: int | None = 1,
    steps: int | None = None,
    *,
    validation: Any = None,
    validate_every: int = 100,
    metric: Callable[..., Any] | None = None,
    history: list[dict[str, Any]] | None = None,
    progress: bool | None = None,
) -> Estimator:
    """Train ``estimator`` incrementally: ``estimator.partial_fit`` on each batch; returns the estimator.

    Each batch is ``(X, y)``, ``(X, y, sample_weight)`` or ``X`` alone (for
    unsupervised estimators such as ``MiniBatchKMeans`` or ``IncrementalPCA``);
    a list is read like a tuple. ``classes`` goes to the first call only, as
    scikit-learn asks. ``batches`` is a view, a sequence, or any iterable,
    loaders included (``lazyseq.prefetch``, ``lazyseq.load_buffers``).

    ``epochs`` passes are made over ``batches`` (``None``: as many as
    ``steps`` needs), which must then be readable again: a view or a
    sequence, not a one-shot iterator (which gives one pass: with
    ``epochs=None``, ``fit`` stops at ``steps`` or where it ends). ``steps`` stops after that many calls
    in all; an infinite view or ``load_buffers`` needs it. A plain iterator
    that never ends cannot be recognised: without ``steps``, ``fit`` reads it
    for ever.

    Every ``validate_every`` steps, and after the last, the estimator is scored
    on ``validation`` (items ``(X, y)``) with :func:`score` and ``metric``; each
    result is shown on the progress bar and appended to ``history`` as
    ``{"step": ..., "epoch": ..., "score": ...}``. ``progress`` shows a bar
    (see :mod:`lazyseq.progress`).

    >>> import numpy as np
    >>> import lazyseq
    >>> from lazyseq.sklearn import fit
    >>> from sklearn.naive_bayes import GaussianNB
    >>> x = np.array([[0.0], [0.2], [0.9], [1.1]] * 4)
    >>> y = np.array([0, 0, 1, 1] * 4)
    >>> train = lazyseq.collate([x, y])
    >>> history = []
    >>> model = fit(GaussianNB(), train.batch(4), classes=[0, 1], epochs=2,
    ...             validation=train, validate_every=5, history=history, progress=False)
    >>> model.predict([[0.1], [1.0]])
    array([0, 1])
    >>> history
    [{'step': 5, 'epoch': 1, 'score': 1.0}, {'step': 8, 'epoch': 1, 'score': 1.0}]
    """
    call = _PartialFit(estimator, classes, _whole_arrays_hint(batches, "batches"))
    _check_count("validate_every", validate_every)
    check_metric(metric, "fit")
    if history is not None and not callable(getattr(history, "append", None)):
        raise TypeError(
            f"fit: history must be a list, which each validation appends its result to, not {type(history).__name__}"
        )
    source = _Batches(batches, epochs, steps)
    check = None if validation is None else _Validation(estimator, validation, metric, history)
    step = epoch = 0
    with progress_bar(source.total, "fit", progress, unit="batch") as bar:
        for epoch, batch in source:
            call(batch, step)
            del batch  # a batch from a shared slot can be reused as soon as it is dropped
            step += 1
            bar.update()
            if check is not None and step % validate_every == 0:
                check(step, epoch, bar)
        if step == 0:
            closed = getattr(batches, "closed", False) is True  # a loader closed before (by an error, say)
            why = ": they come from a closed loader; make a new one" if closed else ""
            raise ValueError(f"fit: batches gave no batch, so partial_fit was never called{why}")
        if check is not None and step % validate_every:
            check(step, epoch, bar)
    return estimator


class _PartialFit:
    """Calls ``estimator.partial_fit`` with what a batch holds, after checking the estimator can take it."""

    def __init__(self, estimator: Any, classes: Any, hint: str = "") -> None:
        name = type(estimator).__name__
        self.hint = hint  # what to do where the batches look like (X, y) of whole arrays
        self.layout = FeatureLayout()  # the batches of one call are read one way
        method = getattr(estimator, "partial_fit", None)
        if not callable(method):
            raise TypeError(
                f"fit: {name} has no partial_fit method; lazyseq.sklearn.fit trains one batch at a time, so it "
                "needs an estimator that learns incrementally (SGDClassifier, SGDRegressor, GaussianNB, "
                "MiniBatchKMeans, IncrementalPCA, ...)"
            )
        accepts = _keywords(method)
        if classes is not None and not accepts("classes"):
            raise TypeError(f"fit: {name}.partial_fit takes no classes; leave classes=None for this estimator")
        self.method = method
        self.name = name
        self.classes = classes
        self.takes_weights = accepts("sample_weight")
        self.needs_targets = _needs_targets(method)

    def __call__(self, batch: Any, step: int) -> None:
        X, y, weights = fields(batch, f"fit: batch {step}", self.layout)
        _check_rows(X, step)
        keywords = {}
        if step == 0 and self.classes is not None:
            keywords["classes"] = self.classes
        if weights is not None:
            if not self.takes_weights:
                raise TypeError(
                    f"fit: batch {step} is (X, y, sample_weight), but {self.name}.partial_fit takes no sample_weight"
                )
            keywords["sample_weight"] = weights
        if y is None and self.needs_targets:
            raise TypeError(
                f"fit: batch {step} is X alone, but {self.name}.partial_fit needs targets: batches must be "
                f"(X, y) or (X, y, sample_weight){self.hint or _rows_hint(batch)}"
            )
        try:
            if y is None:
                self.method(X, **keywords)
            else:
                self.method(X, y, **keywords)
        except Exception as error:
            error.add_note(f"raised by {self.name}.partial_fit on batch {step} in lazyseq.sklearn.fit")
            raise


def _keywords(method: Callable) -> Callable[[str], bool]:
    """Whether ``method`` accepts a keyword argument of a given name."""
    try:
        parameters = inspect.signature(method).parameters
    except (TypeError, ValueError):  # no signature to read: let the call itself tell
        return lambda name: True
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values()):
        return lambda name: True
    return parameters.__contains__


def _needs_targets(method: Callable) -> bool:
    try:
        y = inspect.signature(method).parameters.get("y")
    except (TypeError, ValueError):
        return False
    return y is not None and y.default is inspect.Parameter.empty


def _check_rows(X: Any, step: int) -> None:
    """A batch of one sample (a view that was not batched) gets a hint instead of scikit-learn's message."""
    dtype = getattr(X, "dtype", None)
    numeric = getattr(dtype, "kind", "") in tuple("biufc") or type(dtype).__module__ == "torch"  # torch: no kind
    if getattr(X, "ndim", None) == 1 and numeric:
        raise ValueError(
            f"fit: batch {step} has X of shape {X.shape}, one sample; each batch must hold several rows "
            "(X of 2 dimensions): batch a view of samples first, for instance view.batch(64)"
        )


class _Batches:
    """The batches to fit, as ``(epoch, batch)`` pairs, with the checks that keep ``fit`` from looping for ever."""

    def __init__(self, batches: Iterable, epochs: int | None, steps: int | None) -> None:
        if steps is not None:
            _check_count("steps", steps)
        if epochs is not None:
            _check_count("epochs", epochs)
        elif steps is None:
            raise ValueError("fit: epochs=None means as many passes as steps needs, so it needs steps")
        if not isinstance(batches, Iterable):
            raise TypeError(_not_batches(batches))
        endless = _endless(batches)
        if endless and steps is None:
            raise ValueError(f"fit: batches {endless}, so fit would never stop: pass steps=N to stop after N batches")
        one_shot = isinstance(batches, Iterator)
        if one_shot and not endless and epochs not in (1, None):  # epochs=None: one pass, as far as steps needs
            raise ValueError(
                f"fit: batches is a one-shot iterator ({type(batches).__name__}) that can be read only once, "
                f"so epochs={epochs} cannot be made; pass a view or a sequence, or epochs=1"
            )
        self.batches = batches
        self.epochs = epochs
        self.steps = steps
        self.total = _total(batches, epochs, steps, endless)

    def __iter__(self) -> Iterator[tuple[int, Any]]:
        left = self.steps
        passes = itertools.count() if self.epochs is None else range(self.epochs)
        for epoch in passes:
            given = 0
            iterator = iter(self.batches)
            # The count is checked before reading: an iterator keeps the batches that are not needed.
            while left is None or left > 0:
                try:
                    batch = next(iterator)
                except StopIteration:
                    break
                given += 1
                left = None if left is None else left - 1
                yield epoch, batch
                del batch
            if not given or left == 0:
                return


def _not_batches(batches: object) -> str:
    name = type(batches).__name__
    hint = ""
    if hasattr(batches, "__getitem__") and hasattr(batches, "__len__"):  # samples (a torch Dataset, say)
        hint = f"; batches of the samples of a {name} are lazyseq.view(samples).batch(64)"
    return f"fit: batches must be a view, a sequence or an iterable, not {name}{hint}"


def _endless(batches: Iterable) -> str:
    """Why ``batches`` is known never to end, or ``""``."""
    if isinstance(batches, View) and batches.is_infinite and not batches._may_end():
        return f"is an infinite view ({batches._label()})"
    if isinstance(batches, BufferLoader):
        return "come from load_buffers, which never ends"
    return ""


def _total(batches: Iterable, epochs: int | None, steps: int | None, endless: str) -> int | None:
    """How many steps the progress bar counts to (``None``: unknown)."""
    if endless or epochs is None or not isinstance(batches, Sized):
        return steps
    try:
        count = len(batches) * epochs
    except TypeError:  # a view of unknown length (uniter)
        return steps
    return count if steps is None else min(count, steps)


class _Validation:
    """Scores the estimator on the validation data, records the result and shows it."""

    def __init__(self, estimator: Any, validation: Any, metric: Callable | None, history: list | None) -> None:
        self.estimator = estimator
        self.data = sized_view(validation, "fit: validation")  # checked now, not after the first hundred steps
        self.metric = metric
        self.history = history
        rule = "metric" if metric is not None else score_rule(estimator, "fit")
        if self.data._need_length("fit: validation") == 0:  # scored in chunks, as evaluate() reads
            raise ValueError("fit: validation is empty: there is nothing to score the estimator on")
        if rule in ("metric", "accuracy", "r2"):  # scored against targets: are there any?
            _, targets, _ = fields(self.data[:1].batch(1)[0], "fit: an item of validation")
            if targets is None:
                raise ValueError(
                    f"fit: the items of validation are X alone, but {type(estimator).__name__} is scored against "
                    f"targets: items must be (X, y) or (X, y, sample_weight){_whole_arrays_hint(validation, 'validation')}"
                )

    def __call__(self, step: int, epoch: int, bar: ProgressBar) -> None:
        value = score(self.estimator, self.data, metric=self.metric, progress=False)
        if self.history is not None:
            self.history.append({"step": step, "epoch": epoch, "score": value})
        bar.show(score=value)


def _rows_hint(batch: Any) -> str:
    """How a list of 2 or 3 tensors of one 1-D shape was read, where it may have been meant as ``(x, y)``."""
    if type(batch) is not list or len(batch) not in (2, 3) or getattr(batch[0], "ndim", None) != 1:
        return ""
    return (
        f"; a list of {len(batch)} 1-D tensors of one shape is read as {len(batch)} rows of X: for (x, y) with one "
        "feature, make x 2-D (x[:, None])"
    )


def _whole_arrays_hint(given: Any, name: str) -> str:
    """What to do where ``given`` looks like ``(X, y)`` of whole arrays, read as a sequence of two batches or items."""
    if not isinstance(given, (tuple, list)) or not 2 <= len(given) <= 3:
        return ""
    if not all(getattr(part, "ndim", 0) >= 1 for part in given):
        return ""
    fields = "[X, y]" if len(given) == 2 else "[X, y, sample_weight]"
    what = "batches" if name == "batches" else "items"
    each = ".batch(batch_size)" if name == "batches" else ""
    return (
        f"; {name}=({fields[1:-1]}) of whole arrays is read as {len(given)} {what}: pass "
        f"lazyseq.collate({fields}){each}"
    )


def _check_count(name: str, value: Any) -> None:
    integer(value, f"fit: {name}", low=1)
