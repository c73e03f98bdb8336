"""scikit-learn on lazy views: incremental training, chunked prediction and scoring (``lazyseq[sklearn]``).

``fit`` calls ``partial_fit`` batch after batch, from a view, a sequence or a
loader; ``predict`` and ``score`` run an estimator over data far larger than
memory, one chunk at a time, with :func:`lazyseq.evaluate`. scikit-learn is
imported only when one of them needs it, and ``import lazyseq`` does not
import this module.
"""

from __future__ import annotations

import inspect
import itertools
import math
import numbers
from collections.abc import Callable, Iterable, Iterator, Mapping, Sized
from typing import Any

import numpy as np

from .evaluate import evaluate
from .loading.buffers import BufferLoader
from .progress import ProgressBar, progress_bar
from .views.base import View
from .views.sources import as_view

__all__ = ["fit", "predict", "score"]

ITEM_SHAPES = "(X, y), (X, y, sample_weight) or X alone"


# -- fit ----------------------------------------------------------------------------------------


def fit(
    estimator: Any,
    batches: Iterable,
    classes: Any = None,
    epochs: int | None = 1,
    steps: int | None = None,
    *,
    validation: Any = None,
    validate_every: int = 100,
    metric: Callable[..., Any] | None = None,
    history: list | None = None,
    progress: bool | None = None,
) -> Any:
    """Train ``estimator`` incrementally: ``estimator.partial_fit`` on each batch; returns the estimator.

    Each batch is ``(X, y)``, ``(X, y, sample_weight)`` or ``X`` alone (for
    unsupervised estimators such as ``MiniBatchKMeans`` or ``IncrementalPCA``);
    a list is read like a tuple. ``classes`` goes to the first call only, as
    scikit-learn asks. ``batches`` is a view, a sequence, or any iterable,
    loaders included (``lazyseq.prefetch``, ``lazyseq.load_buffers``).

    ``epochs`` passes are made over ``batches`` (``None``: as many as
    ``steps`` needs), which must then be readable again: a view or a
    sequence, not a one-shot iterator. ``steps`` stops after that many calls
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
    call = _PartialFit(estimator, classes)
    _check_count("validate_every", validate_every)
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
            raise ValueError("fit: batches gave no batch, so partial_fit was never called")
        if check is not None and step % validate_every:
            check(step, epoch, bar)
    return estimator


class _PartialFit:
    """Calls ``estimator.partial_fit`` with what a batch holds, after checking the estimator can take it."""

    def __init__(self, estimator: Any, classes: Any) -> None:
        name = type(estimator).__name__
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
        X, y, weights = _fields(batch, f"fit: batch {step}")
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
                "(X, y) or (X, y, sample_weight)"
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
    if getattr(X, "ndim", None) == 1 and dtype is not None and dtype.kind in "biufc":
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
            raise TypeError(f"fit: batches must be a view, a sequence or an iterable, not {type(batches).__name__}")
        endless = _endless(batches)
        if endless and steps is None:
            raise ValueError(f"fit: batches {endless}, so fit would never stop: pass steps=N to stop after N batches")
        one_shot = isinstance(batches, Iterator)
        if one_shot and not endless and epochs != 1:
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
        self.data = as_view(validation)  # checked now, not after the first hundred steps
        self.metric = metric
        self.history = history
        if metric is None:
            _score_rule(estimator, "fit")

    def __call__(self, step: int, epoch: int, bar: ProgressBar) -> None:
        value = score(self.estimator, self.data, metric=self.metric, progress=False)
        if self.history is not None:
            self.history.append({"step": step, "epoch": epoch, "score": value})
        bar.show(score=value)


def _check_count(name: str, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
        raise ValueError(f"fit: {name} must be a positive integer, got {value!r}")


def _fields(batch: Any, where: str) -> tuple[Any, Any, Any]:
    """``(X, y, sample_weight)`` of a batch, ``None`` for what it does not hold."""
    if isinstance(batch, (tuple, list)):
        if len(batch) == 2:
            return batch[0], batch[1], None
        if len(batch) == 3:
            return batch[0], batch[1], batch[2]
        raise ValueError(f"{where} is a {type(batch).__name__} of {len(batch)} items; it must be {ITEM_SHAPES}")
    if batch is None or isinstance(batch, (Mapping, str, bytes, numbers.Number)) or getattr(batch, "ndim", None) == 0:
        raise TypeError(f"{where} is a {type(batch).__name__}; it must be {ITEM_SHAPES}")
    return batch, None, None


# -- predict ------------------------------------------------------------------------------------


def predict(
    estimator: Any,
    data: Any,
    batch_size: int = 1024,
    method: str = "predict",
    out: Any = None,
    *,
    nworkers: int = 0,
    progress: bool | None = None,
) -> np.ndarray:
    """``estimator.<method>`` over ``data`` in chunks of ``batch_size`` items, as one array.

    ``method`` is any method that returns a row per sample: ``"predict"``,
    ``"predict_proba"``, ``"decision_function"``, ``"transform"``, ... Items
    of ``data`` are rows of X, or tuples ``(X, y, ...)`` whose first element
    is used. ``out`` (an array, a memory map or a ``.npy`` path), ``nworkers``
    and ``progress`` are those of :func:`lazyseq.evaluate`, which this calls.

    >>> import numpy as np
    >>> import lazyseq
    >>> from lazyseq.sklearn import predict
    >>> from sklearn.naive_bayes import GaussianNB
    >>> x, y = np.array([[0.0], [0.2], [0.9], [1.1]]), np.array([0, 0, 1, 1])
    >>> model = GaussianNB().fit(x, y)
    >>> predict(model, lazyseq.collate([x, y]), batch_size=3, progress=False)
    array([0, 0, 1, 1])
    >>> predict(model, x, method="predict_proba", progress=False).shape
    (4, 2)
    """
    compute = _method(estimator, method)

    def on_batch(batch: Any) -> Any:
        return compute(_features(batch))

    return evaluate(on_batch, data, batch_size, out=out, nworkers=nworkers, progress=progress, description=method)


def _method(estimator: Any, name: str) -> Callable:
    if not isinstance(name, str):
        raise TypeError(f"predict: method must be the name of a method, such as 'predict', not {name!r}")
    try:
        method = getattr(estimator, name)
    except AttributeError as error:
        reason = f": {error.__cause__}" if error.__cause__ else ""  # scikit-learn's why, e.g. loss='hinge'
        raise AttributeError(f"predict: {type(estimator).__name__} has no method {name!r}{reason}") from error
    if not callable(method):
        raise TypeError(f"predict: {type(estimator).__name__}.{name} is not a method")
    return method


def _features(batch: Any) -> Any:
    """X of a batch: the batch itself, or the first field of a tuple."""
    return batch[0] if isinstance(batch, (tuple, list)) else batch


# -- score --------------------------------------------------------------------------------------


def score(
    estimator: Any,
    data: Any,
    batch_size: int = 1024,
    metric: Callable[..., Any] | None = None,
    *,
    nworkers: int = 0,
    progress: bool | None = None,
) -> float:
    """The score of ``estimator`` on ``data``, computed in chunks of ``batch_size`` items.

    Items are ``(X, y)``, ``(X, y, sample_weight)`` or X alone. Without
    ``metric``, the result is what ``estimator.score`` gives on all the data
    at once: accuracy for classifiers, R² for regressors (from the chunked
    predictions), and for estimators whose score adds up over samples
    (``KMeans``, ``MiniBatchKMeans``, ``PCA``, ``FactorAnalysis``,
    ``GaussianMixture``, ``KernelDensity``), that score, chunk by chunk.
    Other estimators need ``metric``: ``metric(y_true, y_pred)`` (with
    ``sample_weight=`` when items carry weights) is applied to the
    predictions and targets, and what it returns is returned.

    >>> import numpy as np
    >>> import lazyseq
    >>> from lazyseq.sklearn import score
    >>> from sklearn.metrics import f1_score
    >>> from sklearn.naive_bayes import GaussianNB
    >>> x, y = np.array([[0.0], [0.2], [0.9], [1.1]]), np.array([0, 0, 1, 1])
    >>> model = GaussianNB().fit(x, y)
    >>> test_x, test_y = np.array([[0.1], [0.4], [0.6], [1.0], [0.45]]), np.array([0, 1, 1, 1, 0])
    >>> test = lazyseq.collate([test_x, test_y])
    >>> score(model, test, batch_size=2, progress=False), model.score(test_x, test_y)
    (0.8, 0.8)
    >>> score(model, test, metric=f1_score, progress=False)
    0.8
    """
    rule = "metric" if metric is not None else _score_rule(estimator, "score")
    collect, finish = _scorer(rule, estimator, metric)
    results = evaluate(collect, data, batch_size, nworkers=nworkers, progress=progress, description="score")
    return finish(results)


# How ``estimator.score`` is computed, keyed by the function that computes it (found when first needed).
_RULES: dict[Callable, str] = {}


def _score_rule(estimator: Any, caller: str) -> str:
    """How to compute ``estimator.score`` exactly from chunks, or a TypeError saying to pass ``metric``."""
    from sklearn.base import is_classifier, is_regressor

    scorer = _final_step(estimator)
    name = type(estimator).__name__
    function = getattr(type(scorer), "score", None)
    if function is None:
        raise TypeError(f"{caller}: {name} has no score method; pass metric=, for instance metric=accuracy_score")
    rule = _known_rules().get(function)
    if rule == "accuracy" and not is_classifier(scorer) or rule == "r2" and not is_regressor(scorer):
        rule = None
    if rule is None:
        raise TypeError(
            f"{caller}: {name}.score cannot be computed in chunks (lazyseq knows how for classifiers, regressors, "
            "KMeans, PCA, FactorAnalysis, GaussianMixture and KernelDensity); pass metric=, for instance "
            "metric=sklearn.metrics.accuracy_score, to score its predictions"
        )
    return rule


def _known_rules() -> dict[Callable, str]:
    if not _RULES:
        from sklearn.base import ClassifierMixin, RegressorMixin
        from sklearn.cluster import KMeans
        from sklearn.decomposition import PCA, FactorAnalysis
        from sklearn.mixture import GaussianMixture
        from sklearn.neighbors import KernelDensity, KNeighborsClassifier, RadiusNeighborsClassifier

        _RULES.update(
            {
                ClassifierMixin.score: "accuracy",
                KNeighborsClassifier.score: "accuracy",  # ClassifierMixin.score, X=None aside
                RadiusNeighborsClassifier.score: "accuracy",
                RegressorMixin.score: "r2",
                KMeans.score: "total",  # shared by MiniBatchKMeans and BisectingKMeans
                PCA.score: "mean",
                FactorAnalysis.score: "mean",
                GaussianMixture.score: "mean",  # shared by BayesianGaussianMixture
                KernelDensity.score: "sum",
            }
        )
    return _RULES


def _final_step(estimator: Any) -> Any:
    """The estimator whose score a pipeline's score is."""
    from sklearn.pipeline import Pipeline

    while isinstance(estimator, Pipeline):
        estimator = estimator.steps[-1][1]
    return estimator


def _scorer(rule: str, estimator: Any, metric: Callable | None) -> tuple[Callable, Callable]:
    """What to compute for each chunk, and how to turn all of it into the score."""
    if rule == "metric":
        return _supervised(estimator, metric)
    if rule in ("accuracy", "r2"):
        from sklearn.metrics import accuracy_score, r2_score

        collect, finish = _supervised(estimator, accuracy_score if rule == "accuracy" else r2_score)
        return collect, lambda results: float(finish(results))
    if rule == "total":
        return _chunk_totals(estimator)
    return _per_sample(estimator, np.mean if rule == "mean" else np.sum)


def _supervised(estimator: Any, metric: Callable) -> tuple[Callable, Callable]:
    """Predictions and targets (and weights) of each chunk; ``metric`` of all of them."""
    name = type(estimator).__name__

    def collect(batch: Any) -> tuple:
        X, y, weights = _fields(batch, "score: a batch of data")
        if y is None:
            raise ValueError(
                f"score: the items of data are X alone, but {name} is scored against targets: "
                "items must be (X, y) or (X, y, sample_weight)"
            )
        predictions = estimator.predict(X)
        return (predictions, y) if weights is None else (predictions, y, weights)

    def finish(results: tuple) -> Any:
        predictions, targets, *weights = results
        keywords = {"sample_weight": weights[0]} if weights else {}
        return metric(targets, predictions, **keywords)

    return collect, finish


def _per_sample(estimator: Any, reduce: Callable[[np.ndarray], Any]) -> tuple[Callable, Callable]:
    """Scores that are the mean or the sum of ``score_samples`` (which takes no weights)."""

    def collect(batch: Any) -> np.ndarray:
        X, _, weights = _fields(batch, "score: a batch of data")
        if weights is not None:
            raise TypeError(
                f"score: the items of data carry sample weights, but {type(estimator).__name__}.score takes none"
            )
        return estimator.score_samples(X)

    return collect, lambda samples: float(reduce(samples))


def _chunk_totals(estimator: Any) -> tuple[Callable, Callable]:
    """Scores that are a sum over samples (K-means: minus the inertia): ``estimator.score`` of each chunk, added."""
    totals: list[float] = []

    def collect(batch: Any) -> np.ndarray:
        X, _, weights = _fields(batch, "score: a batch of data")
        totals.append(estimator.score(X, sample_weight=weights))
        return np.empty((_count_rows(X), 0))  # evaluate wants a row per item; the totals are kept aside

    return collect, lambda _: math.fsum(totals)


def _count_rows(X: Any) -> int:
    shape = getattr(X, "shape", None)
    return shape[0] if shape is not None else len(X)
