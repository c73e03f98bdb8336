"""``predict`` and ``score``: an estimator over data far larger than memory, one chunk at a time."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, TypeVar, overload

import numpy as np

from ..evaluate import evaluate
from .items import ItemReading, rows_explained

__all__ = ["check_metric", "predict", "score", "score_rule"]

T = TypeVar("T")


def predict(
    estimator: Any,
    data: Any,
    batch_size: int = 1024,
    method: str = "predict",
    out: Any = None,
    *,
    nworkers: int = 0,
    progress: bool | None = None,
) -> Any:
    """``estimator.<method>`` over ``data`` in chunks of ``batch_size`` items, as one array (or sparse matrix).

    ``method`` is any method that returns a row per sample: ``"predict"``,
    ``"predict_proba"``, ``"decision_function"``, ``"transform"``, ... Items
    of ``data`` are rows of X, or tuples ``(X, y, ...)`` whose first element
    is used, as the first item shows: a row is an array or a tensor, or what
    scikit-learn reads as one (a text for a vectorizer, a dict of features,
    a list of values), and such an X reaches ``estimator`` as the list of a
    chunk's rows, as in ``estimator.predict(docs)`` (a list whose first
    entry is an array is ``(X, y, ...)`` too). ``out`` (an array, a memory
    map or a ``.npy`` path), ``nworkers`` and ``progress`` are those of
    :func:`lazyseq.evaluate`, which this calls (sparse results, a
    vectorizer's, are stacked into one sparse matrix). Empty ``data`` is a
    ``ValueError``, as scikit-learn refuses to predict no samples (and the
    predictions' dtype and shape are not known without one): a rank whose
    shard is empty skips the call.

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
    reading = ItemReading.of(data, "predict")

    def on_batch(batch: Any) -> Any:
        X = reading.features(batch, f"{method}: a batch of data")
        with rows_explained(X):
            return compute(X)

    return evaluate(
        on_batch,
        data,
        batch_size,
        out=out,
        collate_fn=reading.collate,
        nworkers=nworkers,
        progress=progress,
        description=method,
    )


def _method(estimator: Any, name: str) -> Callable:
    if not isinstance(name, str):
        raise TypeError(f"predict: method must be the name of a method, such as 'predict', not {name!r}")
    try:
        method = getattr(estimator, name)
    except AttributeError as error:
        if name in ("thread", "process", "ray"):  # lazyseq's method= elsewhere: how chunks are computed
            raise ValueError(
                f"predict: method names the estimator's method here ('predict', 'predict_proba', 'transform', ...), "
                f"not how chunks are computed ({name!r}): nworkers=N computes them in N threads"
            ) from None
        reason = f": {error.__cause__}" if error.__cause__ else ""  # scikit-learn's why, e.g. loss='hinge'
        raise AttributeError(f"predict: {type(estimator).__name__} has no method {name!r}{reason}") from error
    if not callable(method):
        raise TypeError(f"predict: {type(estimator).__name__}.{name} is not a method")
    return method


# -- score --------------------------------------------------------------------------------------


@overload
def score(
    estimator: Any,
    data: Any,
    batch_size: int = ...,
    metric: None = ...,
    *,
    nworkers: int = ...,
    progress: bool | None = ...,
) -> float: ...


@overload
def score(
    estimator: Any,
    data: Any,
    batch_size: int = ...,
    metric: Callable[..., T] = ...,
    *,
    nworkers: int = ...,
    progress: bool | None = ...,
) -> T: ...


def score(
    estimator: Any,
    data: Any,
    batch_size: int = 1024,
    metric: Callable[..., Any] | None = None,
    *,
    nworkers: int = 0,
    progress: bool | None = None,
) -> Any:
    """The score of ``estimator`` on ``data``, computed in chunks of ``batch_size`` items.

    Items are ``(X, y)``, ``(X, y, sample_weight)`` or X alone, read as
    :func:`~lazyseq.sklearn.predict` reads them (texts and dicts of features
    included). Empty ``data`` is a ``ValueError``: a score of no samples is
    not defined (a rank whose shard is empty skips the call). Without
    ``metric``, the result is what ``estimator.score`` gives on all the data
    at once: accuracy for classifiers, R² for regressors (from the chunked
    predictions), and for estimators whose score adds up over samples
    (``KMeans``, ``MiniBatchKMeans``, ``PCA``, ``FactorAnalysis``,
    ``GaussianMixture``, ``KernelDensity``), that score, chunk by chunk
    (a sum taken in another order: equal up to its last bits of rounding).
    Other estimators need ``metric``: ``metric(y_true, y_pred)`` (with
    ``sample_weight=`` when items carry weights) is applied to the
    predictions and targets, and what it returns is returned. ``nworkers``
    and ``progress`` are as for :func:`~lazyseq.sklearn.predict`.

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
    check_metric(metric, "score")
    rule = "metric" if metric is not None else score_rule(estimator, "score")
    reading = ItemReading.of(data, "score")
    collect, finish = _scorer(rule, estimator, metric, reading)
    results = evaluate(
        collect,
        data,
        batch_size,
        collate_fn=reading.collate,
        nworkers=nworkers,
        progress=progress,
        description="score",
    )
    return finish(results)


def check_metric(metric: Any, caller: str) -> None:
    """A ``TypeError`` (before any work) unless ``metric`` is None or a function ``metric(y_true, y_pred)``.

    >>> check_metric("accuracy", "score")
    Traceback (most recent call last):
    ...
    TypeError: score: metric must be a function metric(y_true, y_pred), such as sklearn.metrics.accuracy_score, not \
'accuracy' (a scorer's name is not one)
    """
    if metric is None or callable(metric) and not hasattr(metric, "_score_func"):
        return
    if callable(metric):  # a scorer (make_scorer, get_scorer): it takes (estimator, X, y)
        why = ": a scorer takes (estimator, X, y); pass its function (functools.partial for its keywords)"
    else:
        why = " (a scorer's name is not one)" if isinstance(metric, str) else ""
    raise TypeError(
        f"{caller}: metric must be a function metric(y_true, y_pred), such as sklearn.metrics.accuracy_score, "
        f"not {metric!r}{why}"
    )


# How ``estimator.score`` is computed, keyed by the function that computes it (found when first needed).
_RULES: dict[Callable, str] = {}


def score_rule(estimator: Any, caller: str) -> str:
    """How to compute ``estimator.score`` exactly from chunks, or a TypeError saying to pass ``metric``."""
    from sklearn.base import is_classifier, is_regressor

    scorer = _final_step(estimator)
    name = type(estimator).__name__
    function = getattr(type(scorer), "score", None)
    if function is None:
        if not hasattr(scorer, "predict"):  # a transformer: nothing for a metric of predictions to score
            raise TypeError(f"{caller}: {name} has no score method, nor predictions to score with metric=")
        raise TypeError(f"{caller}: {name} has no score method; pass metric=, for instance metric=accuracy_score")
    rule = _known_rules().get(function)
    if rule == "accuracy" and not is_classifier(scorer) or rule == "r2" and not is_regressor(scorer):
        rule = None
    if rule is None:
        example = "r2_score" if is_regressor(scorer) else "accuracy_score"
        raise TypeError(
            f"{caller}: {name}.score cannot be computed in chunks (lazyseq knows how for classifiers, regressors, "
            "KMeans, PCA, FactorAnalysis, GaussianMixture and KernelDensity); pass metric=, for instance "
            f"metric=sklearn.metrics.{example}, to score its predictions"
        )
    return rule


def _known_rules() -> dict[Callable, str]:
    if not _RULES:
        from sklearn.base import ClassifierMixin, RegressorMixin
        from sklearn.cluster import KMeans
        from sklearn.decomposition import PCA, FactorAnalysis
        from sklearn.dummy import DummyClassifier, DummyRegressor
        from sklearn.mixture import GaussianMixture
        from sklearn.neighbors import KernelDensity, KNeighborsClassifier, RadiusNeighborsClassifier

        _RULES.update(
            {
                ClassifierMixin.score: "accuracy",
                KNeighborsClassifier.score: "accuracy",  # ClassifierMixin.score, X=None aside
                RadiusNeighborsClassifier.score: "accuracy",
                DummyClassifier.score: "accuracy",  # (X=None aside)
                RegressorMixin.score: "r2",
                DummyRegressor.score: "r2",  # (X=None aside)
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


def _scorer(rule: str, estimator: Any, metric: Callable | None, reading: ItemReading) -> tuple[Callable, Callable]:
    """What to compute for each chunk (its items read as ``reading`` says), and how to turn all of it into the score."""
    if rule == "metric":
        assert metric is not None
        return _supervised(estimator, metric, reading)
    if rule in ("accuracy", "r2"):
        from sklearn.metrics import accuracy_score, r2_score

        collect, finish = _supervised(estimator, accuracy_score if rule == "accuracy" else r2_score, reading)
        return collect, lambda results: float(finish(results))
    if rule == "total":
        return _chunk_totals(estimator, reading)
    return _per_sample(estimator, np.mean if rule == "mean" else np.sum, reading)


def _supervised(estimator: Any, metric: Callable, reading: ItemReading) -> tuple[Callable, Callable]:
    """Predictions and targets (and weights) of each chunk; ``metric`` of all of them."""
    name = type(estimator).__name__

    def collect(batch: Any) -> tuple:
        X, y, weights = reading.fields(batch, "score: a batch of data")
        if y is None:
            raise ValueError(
                f"score: the items of data are X alone, but {name} is scored against targets: "
                "items must be (X, y) or (X, y, sample_weight)"
            )
        with rows_explained(X):
            predictions = estimator.predict(X)
        y = _column(y)  # a list would be taken for several outputs
        return (predictions, y) if weights is None else (predictions, y, _column(weights))

    def finish(results: tuple) -> Any:
        predictions, targets, *weights = results
        keywords = {"sample_weight": weights[0]} if weights else {}
        return metric(targets, predictions, **keywords)

    return collect, finish


def _column(values: Any) -> Any:
    """Targets or weights as an array: strings as Python objects, so that no chunk cuts the next one's to its width."""
    if not isinstance(values, (list, tuple)):
        return values
    array = np.asarray(values)
    return np.array(values, dtype=object) if array.dtype.kind in "USV" else array


def _per_sample(estimator: Any, reduce: Callable[[np.ndarray], Any], reading: ItemReading) -> tuple[Callable, Callable]:
    """Scores that are the mean or the sum of ``score_samples`` (which takes no weights)."""

    def collect(batch: Any) -> np.ndarray:
        X, _, weights = reading.fields(batch, "score: a batch of data")
        if weights is not None:
            raise TypeError(
                f"score: the items of data carry sample weights, but {type(estimator).__name__}.score takes none"
            )
        with rows_explained(X):
            return estimator.score_samples(X)

    return collect, lambda samples: float(reduce(samples))


def _chunk_totals(estimator: Any, reading: ItemReading) -> tuple[Callable, Callable]:
    """Scores that are a sum over samples (K-means: minus the inertia): ``estimator.score`` of each chunk, added."""
    totals: list[float] = []

    def collect(batch: Any) -> np.ndarray:
        X, _, weights = reading.fields(batch, "score: a batch of data")
        with rows_explained(X):
            totals.append(estimator.score(X, sample_weight=weights))
        return np.empty((_count_rows(X), 0))  # evaluate wants a row per item; the totals are kept aside

    return collect, lambda _: math.fsum(totals)


def _count_rows(X: Any) -> int:
    shape = getattr(X, "shape", None)
    return shape[0] if shape is not None else len(X)
