"""lazyseq.sklearn: fit, predict and score over views give what scikit-learn gives on the same batches or data."""

import subprocess
import sys

import numpy as np
import pytest

pytest.importorskip("sklearn")

from sklearn.cluster import MiniBatchKMeans  # noqa: E402
from sklearn.decomposition import PCA, IncrementalPCA  # noqa: E402
from sklearn.linear_model import LinearRegression, PoissonRegressor, SGDClassifier, SGDRegressor  # noqa: E402
from sklearn.metrics import f1_score, mean_absolute_error  # noqa: E402
from sklearn.naive_bayes import GaussianNB  # noqa: E402
from sklearn.pipeline import make_pipeline  # noqa: E402
from sklearn.preprocessing import StandardScaler  # noqa: E402

import lazyseq  # noqa: E402
from lazyseq.sklearn import fit, predict, score  # noqa: E402

N, WIDTH, BATCH = 120, 4, 16  # 8 batches, the last one of 8 rows
CLASSES = np.arange(3)

rng = np.random.default_rng(0)
LABELS = rng.integers(3, size=N)
X = rng.standard_normal((N, WIDTH)) + LABELS[:, None]
TARGETS = X @ np.array([1.0, -2.0, 0.5, 3.0]) + 0.1 * rng.standard_normal(N)
WEIGHTS = rng.uniform(0.5, 2.0, size=N)


def labelled(*fields):
    return lazyseq.collate([X, *fields])


def by_hand(estimator, batches, epochs=1, **first_call):
    """The loop that fit replaces: partial_fit on each batch, the keywords on the first call only."""
    for _ in range(epochs):
        for batch in batches:
            fields = batch if isinstance(batch, tuple) else (batch,)
            keywords = dict(first_call)
            if len(fields) == 3:
                keywords["sample_weight"] = fields[2]
            estimator.partial_fit(*fields[:2], **keywords)
            first_call = {}
    return estimator


def assert_same_fit(got, want):
    """Every fitted attribute (``name_``) equal, exactly."""
    names = sorted(k for k in vars(want) if k.endswith("_") and not k.startswith("_"))
    assert names and names == sorted(k for k in vars(got) if k.endswith("_") and not k.startswith("_"))
    for name in names:
        np.testing.assert_array_equal(getattr(got, name), getattr(want, name), err_msg=name)


class Recorder:
    """An estimator that remembers how partial_fit was called."""

    def __init__(self):
        self.calls = []

    def partial_fit(self, X, y, classes=None, sample_weight=None):
        self.calls.append({"X": X, "y": y, "classes": classes, "sample_weight": sample_weight})
        return self


# -- fit ---------------------------------------------------------------------------------------------


ESTIMATORS = {
    "GaussianNB": (GaussianNB, (LABELS,), {"classes": CLASSES}),
    "SGDClassifier": (lambda: SGDClassifier(random_state=0), (LABELS,), {"classes": CLASSES}),
    "SGDRegressor": (lambda: SGDRegressor(random_state=0), (TARGETS,), {}),
    "MiniBatchKMeans": (lambda: MiniBatchKMeans(n_clusters=3, random_state=0, n_init=1), (), {}),
    "IncrementalPCA": (lambda: IncrementalPCA(n_components=2), (), {}),
}


@pytest.mark.parametrize("name", ESTIMATORS)
def test_fit_equals_partial_fit_by_hand(name):
    make, fields, keywords = ESTIMATORS[name]
    batches = labelled(*fields).batch(BATCH) if fields else lazyseq.view(X).batch(BATCH)
    got = fit(make(), batches, epochs=2, progress=False, **keywords)
    assert_same_fit(got, by_hand(make(), batches, epochs=2, **keywords))


def test_fit_passes_sample_weights():
    batches = labelled(LABELS, WEIGHTS).batch(BATCH)
    got = fit(SGDClassifier(random_state=0), batches, classes=CLASSES, progress=False)
    assert_same_fit(got, by_hand(SGDClassifier(random_state=0), batches, classes=CLASSES))
    unweighted = fit(SGDClassifier(random_state=0), labelled(LABELS).batch(BATCH), classes=CLASSES, progress=False)
    assert not np.array_equal(unweighted.coef_, got.coef_)
    recorded = fit(Recorder(), batches, progress=False).calls
    np.testing.assert_array_equal(np.concatenate([c["sample_weight"] for c in recorded]), WEIGHTS)


def test_fit_gives_classes_on_the_first_call_only():
    calls = fit(Recorder(), labelled(LABELS).batch(BATCH), classes=CLASSES, epochs=2, progress=False).calls
    assert len(calls) == 16
    assert calls[0]["classes"] is CLASSES
    assert all(call["classes"] is None for call in calls[1:])


def test_fit_reads_lists_sequences_and_generators():
    batches = list(labelled(LABELS).batch(BATCH))
    want = by_hand(GaussianNB(), batches, classes=CLASSES)
    as_lists = [list(batch) for batch in batches]
    for source in (batches, as_lists, iter(batches), (b for b in batches)):
        assert_same_fit(fit(GaussianNB(), source, classes=CLASSES, progress=False), want)


def test_epochs_pass_over_the_batches_again_in_order():
    calls = fit(Recorder(), labelled(LABELS).batch(BATCH), epochs=3, progress=False).calls
    assert len(calls) == 24
    np.testing.assert_array_equal(np.concatenate([c["y"] for c in calls]), np.tile(LABELS, 3))


def test_steps_stop_fit_across_epochs():
    batches = labelled(LABELS).batch(BATCH)
    calls = fit(Recorder(), batches, epochs=2, steps=11, progress=False).calls
    np.testing.assert_array_equal(np.concatenate([c["y"] for c in calls]), np.concatenate([LABELS, LABELS[:48]]))
    assert len(fit(Recorder(), batches, epochs=1, steps=100, progress=False).calls) == 8  # epochs end it first
    assert len(fit(Recorder(), batches, epochs=None, steps=20, progress=False).calls) == 20  # as many as needed


def test_steps_leave_the_rest_of_an_iterator_unread():
    batches = list(labelled(LABELS).batch(BATCH))
    iterator = iter(batches)
    fit(Recorder(), iterator, steps=3, progress=False)
    assert next(iterator) is batches[3]


def test_steps_end_an_infinite_view_and_load_buffers():
    batches = labelled(LABELS).batch(BATCH)
    calls = fit(Recorder(), lazyseq.cycle(batches), steps=10, progress=False).calls
    np.testing.assert_array_equal(np.concatenate([c["y"] for c in calls]), np.concatenate([LABELS, LABELS[:32]]))

    first = batches[0]
    with lazyseq.load_buffers(lambda: first, nworkers=1, copy=True) as loader:
        got = fit(GaussianNB(), loader, classes=CLASSES, steps=3, progress=False)
    assert_same_fit(got, by_hand(GaussianNB(), [first] * 3, classes=CLASSES))


@pytest.mark.parametrize("method", ["thread", "process"])
def test_fit_through_prefetch(method):
    batches = labelled(LABELS).batch(BATCH)
    with lazyseq.prefetch(batches, nworkers=2, method=method) as loader:
        got = fit(GaussianNB(), loader, classes=CLASSES, epochs=2, progress=False)
    assert_same_fit(got, by_hand(GaussianNB(), batches, epochs=2, classes=CLASSES))


def test_fit_unsupervised_on_x_alone_and_on_pairs():
    make, _, _ = ESTIMATORS["MiniBatchKMeans"]
    alone = fit(make(), lazyseq.view(X).batch(BATCH), progress=False)
    pairs = fit(make(), labelled(LABELS).batch(BATCH), progress=False)  # the labels are ignored
    assert_same_fit(pairs, alone)


# -- fit: validation ----------------------------------------------------------------------------------


def test_validation_history_records_steps_epochs_and_scores():
    batches = labelled(LABELS).batch(BATCH)
    validation = labelled(LABELS)[:50]
    history = []
    fit(GaussianNB(), batches, classes=CLASSES, epochs=2, validation=validation, validate_every=5, history=history,
        progress=False)  # fmt: skip
    assert [(h["step"], h["epoch"]) for h in history] == [(5, 0), (10, 1), (15, 1), (16, 1)]

    model, scores, step = GaussianNB(), [], 0
    for _ in range(2):
        for x, y in batches:
            model.partial_fit(x, y, classes=CLASSES)
            step += 1
            if step in (5, 10, 15, 16):
                scores.append(model.score(X[:50], LABELS[:50]))
    assert [h["score"] for h in history] == scores


def test_validation_with_a_metric():
    batches = labelled(LABELS).batch(BATCH)
    history = []
    model = fit(GaussianNB(), batches, classes=CLASSES, steps=4, validation=labelled(LABELS), validate_every=3,
                metric=mean_absolute_error, history=history, progress=False)  # fmt: skip
    assert [h["step"] for h in history] == [3, 4]
    assert history[-1]["score"] == mean_absolute_error(LABELS, model.predict(X))


# -- fit: errors --------------------------------------------------------------------------------------


def test_fit_needs_partial_fit():
    with pytest.raises(TypeError, match="LinearRegression has no partial_fit method.*learns incrementally"):
        fit(LinearRegression(), labelled(TARGETS).batch(BATCH))


def test_fit_errors_about_what_partial_fit_takes():
    with pytest.raises(TypeError, match="SGDRegressor.partial_fit takes no classes"):
        fit(SGDRegressor(), labelled(TARGETS).batch(BATCH), classes=CLASSES)
    with pytest.raises(TypeError, match=r"batch 0 is \(X, y, sample_weight\), but IncrementalPCA.partial_fit"):
        fit(IncrementalPCA(2), labelled(LABELS, WEIGHTS).batch(BATCH), progress=False)
    with pytest.raises(TypeError, match="batch 0 is X alone, but GaussianNB.partial_fit needs targets"):
        fit(GaussianNB(), lazyseq.view(X).batch(BATCH), classes=CLASSES, progress=False)


def test_fit_errors_about_batches():
    with pytest.raises(ValueError, match=r"batch 0 is a tuple of 4 items; it must be \(X, y\), \(X, y, sample_w"):
        fit(Recorder(), [(X, LABELS, WEIGHTS, WEIGHTS)], progress=False)
    with pytest.raises(TypeError, match="batch 0 is of type dict; it must be"):
        fit(Recorder(), [{"x": X, "y": LABELS}], progress=False)
    with pytest.raises(ValueError, match=r"batch 0 has X of shape \(4,\), one sample.*view.batch\(64\)"):
        fit(GaussianNB(), labelled(LABELS), classes=CLASSES, progress=False)
    with pytest.raises(TypeError, match="batches must be a view, a sequence or an iterable, not int"):
        fit(Recorder(), 3)
    with pytest.raises(ValueError, match="batches gave no batch, so partial_fit was never called$"):
        fit(Recorder(), [], progress=False)
    closed = lazyseq.load_buffers(lambda: (X[:4], LABELS[:4]), nworkers=1)
    closed.close()
    with pytest.raises(ValueError) as caught:
        fit(Recorder(), closed, steps=3, progress=False)
    assert str(caught.value) == (
        "fit: batches gave no batch, so partial_fit was never called: they come from a closed loader; make a new one"
    )


def test_an_error_in_partial_fit_names_the_batch():
    batches = [(X[:10], LABELS[:10]), (X[:10, :2], LABELS[:10])]
    with pytest.raises(ValueError, match="features") as caught:
        fit(GaussianNB(), batches, classes=CLASSES, progress=False)
    assert caught.value.__notes__ == ["raised by GaussianNB.partial_fit on batch 1 in lazyseq.sklearn.fit"]


def test_fit_refuses_to_loop_for_ever():
    with pytest.raises(ValueError, match=r"batches is an infinite view \(cycle\).*pass steps=N"):
        fit(Recorder(), lazyseq.cycle(labelled(LABELS).batch(BATCH)))
    with lazyseq.load_buffers(lambda: (X, LABELS), nworkers=1) as loader:
        with pytest.raises(ValueError, match="batches come from load_buffers, which never ends.*pass steps=N"):
            fit(Recorder(), loader)
    with pytest.raises(ValueError, match="epochs=None means as many passes as steps needs, so it needs steps"):
        fit(Recorder(), [(X, LABELS)], epochs=None)


def test_fit_errors_about_counts_and_one_shot_iterators():
    with pytest.raises(ValueError, match=r"one-shot iterator \(list_iterator\).*epochs=2 cannot be made"):
        fit(Recorder(), iter([(X, LABELS)]), epochs=2)
    for keyword in ("epochs", "steps", "validate_every"):
        with pytest.raises(ValueError, match=f"{keyword} must be a positive integer, got 0"):
            fit(Recorder(), [(X, LABELS)], **{keyword: 0})


def test_validation_errors_before_training():
    recorder = IncrementalPCA(2)
    with pytest.raises(
        TypeError, match="^fit: IncrementalPCA has no score method, nor predictions to score with metric=$"
    ):
        fit(recorder, lazyseq.view(X).batch(BATCH), validation=lazyseq.view(X))
    assert not hasattr(recorder, "components_")
    model = GaussianNB()
    with pytest.raises(ValueError) as info:  # X alone, for a model scored against targets
        fit(model, labelled(LABELS).batch(BATCH), classes=[0, 1, 2], validation=lazyseq.view(X), progress=False)
    assert str(info.value) == (
        "fit: the items of validation are X alone, but GaussianNB is scored against targets: items must be (X, y) "
        "or (X, y, sample_weight)"
    )
    assert not hasattr(model, "classes_")  # refused before the first step
    with pytest.raises(ValueError) as info:  # an error about evaluate's data, after all the training
        fit(model, labelled(LABELS).batch(BATCH), classes=[0, 1, 2], validation=labelled(LABELS)[:0], progress=False)
    assert str(info.value) == "fit: validation is empty: there is nothing to score the estimator on"
    assert not hasattr(model, "classes_")
    for endless, says in [
        (lazyseq.cycle(labelled(LABELS)), "cycle view is infinite"),
        (
            lazyseq.uniter(iter(labelled(LABELS)[:50])),
            "uniter view has no known length; uniter(iterable, size=n) gives an iterable of n items its length",
        ),
    ]:  # refused after validate_every steps of training
        with pytest.raises(TypeError) as info:
            fit(model, labelled(LABELS).batch(BATCH), classes=[0, 1, 2], validation=endless, progress=False)
        assert str(info.value) == f"fit: validation needs a length, but {says}"
        assert not hasattr(model, "classes_")


def test_string_labels_in_a_list_are_scored_whole():
    # A list of strings in a batch was taken for several results of the chunk; a chunk's strings cut to its width.
    names = ["a", "horse", "cat"]
    labels = [names[k] for k in LABELS]
    model = GaussianNB().fit(X, labels)
    data = lazyseq.collate([X, labels])
    assert score(model, data, batch_size=BATCH, progress=False) == model.score(X, labels)
    history = []
    fit(GaussianNB(), data.batch(BATCH), classes=names, validation=data, history=history, progress=False)
    assert history[-1]["score"] == model.score(X, labels)


def test_tensor_items_alone_are_rows_of_x():
    # A batch of tensor items is a list of tensors: its first two were taken for (X, y), its first for X.
    torch = pytest.importorskip("torch")
    tensors = lazyseq.smap(torch.from_numpy, X)
    kmeans = MiniBatchKMeans(2, n_init=1, random_state=0).fit(X)
    np.testing.assert_array_equal(predict(kmeans, tensors, batch_size=BATCH, progress=False), kmeans.predict(X))
    assert score(kmeans, tensors, batch_size=BATCH, progress=False) == pytest.approx(kmeans.score(X), rel=1e-12)
    model = fit(IncrementalPCA(2), tensors.batch(BATCH), progress=False)
    expected = IncrementalPCA(2)
    for start in range(0, N, BATCH):
        expected.partial_fit(X[start : start + BATCH])
    np.testing.assert_array_equal(model.components_, expected.components_)


def test_one_pass_of_a_one_shot_iterator_as_far_as_steps_needs():
    batches = (batch for batch in labelled(LABELS).batch(BATCH))
    recorder = Recorder()
    fit(recorder, batches, epochs=None, steps=2, progress=False)
    assert len(recorder.calls) == 2


def test_a_batch_of_one_torch_sample_gets_the_hint():
    torch = pytest.importorskip("torch")
    with pytest.raises(ValueError, match=r"^fit: batch 0 has X of shape \(3,\), one sample"):
        fit(GaussianNB(), [(torch.rand(3), torch.tensor(1))], classes=[0, 1], progress=False)


def test_a_torch_dataset_of_samples(classifier):
    # Batches of tensor samples hold lists of tensors: score took the list of targets for several results.
    torch = pytest.importorskip("torch")
    from torch.utils.data import TensorDataset

    samples = TensorDataset(torch.from_numpy(X), torch.from_numpy(LABELS))
    with pytest.raises(TypeError) as caught:
        fit(GaussianNB(), samples, classes=CLASSES, progress=False)
    assert str(caught.value) == (
        "fit: batches must be a view, a sequence or an iterable, not TensorDataset; batches of the samples of a "
        "TensorDataset are lazyseq.view(samples).batch(64)"
    )
    model = fit(GaussianNB(), lazyseq.view(samples).batch(BATCH), classes=CLASSES, progress=False)
    expected = GaussianNB()
    for start in range(0, len(X), BATCH):
        expected.partial_fit(X[start : start + BATCH], LABELS[start : start + BATCH], classes=CLASSES)
    np.testing.assert_array_equal(model.theta_, expected.theta_)
    assert score(classifier, samples, batch_size=100, progress=False) == classifier.score(X, LABELS)
    np.testing.assert_array_equal(predict(classifier, samples, progress=False), classifier.predict(X))


# -- predict ------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def classifier():
    return SGDClassifier(loss="log_loss", random_state=0).fit(X, LABELS)


@pytest.mark.parametrize("method", ["predict", "predict_proba", "decision_function"])
def test_predict_equals_the_method_on_all_data(classifier, method):
    want = getattr(classifier, method)(X)
    np.testing.assert_array_equal(predict(classifier, labelled(LABELS), 32, method, progress=False), want)
    np.testing.assert_array_equal(predict(classifier, X, 50, method, nworkers=1, progress=False), want)


def test_predict_transform():
    pca = IncrementalPCA(n_components=2).fit(X)
    np.testing.assert_array_equal(predict(pca, X, 32, "transform", progress=False), pca.transform(X))


def test_predict_into_a_npy_file_and_a_memmap(classifier, tmp_path):
    want = classifier.predict_proba(X)
    path = tmp_path / "proba.npy"
    got = predict(classifier, X, 32, "predict_proba", out=path, progress=False)
    assert isinstance(got, np.memmap)
    np.testing.assert_array_equal(np.load(path), want)
    target = np.lib.format.open_memmap(tmp_path / "given.npy", mode="w+", dtype=np.float64, shape=want.shape)
    assert predict(classifier, X, 32, "predict_proba", out=target, progress=False) is target
    np.testing.assert_array_equal(np.load(tmp_path / "given.npy"), want)


def test_predict_errors_about_the_method(classifier):
    hinge = SGDClassifier(random_state=0).fit(X, LABELS)
    with pytest.raises(AttributeError, match="SGDClassifier has no method 'predict_proba'.*loss='hinge'"):
        predict(hinge, X, method="predict_proba")
    with pytest.raises(AttributeError, match="GaussianNB has no method 'transform'"):
        predict(GaussianNB(), X, method="transform")
    with pytest.raises(TypeError, match="method must be the name of a method"):
        predict(classifier, X, method=classifier.predict)
    with pytest.raises(ValueError) as caught:  # what method= means to evaluate and the loaders
        predict(classifier, X, method="process")
    assert str(caught.value) == (
        "predict: method names the estimator's method here ('predict', 'predict_proba', 'transform', ...), not how "
        "chunks are computed ('process'): nworkers=N computes them in N threads"
    )


# -- score --------------------------------------------------------------------------------------------


def test_score_of_a_classifier_is_its_accuracy(classifier):
    assert score(classifier, labelled(LABELS), 32, progress=False) == classifier.score(X, LABELS)
    weighted = score(classifier, labelled(LABELS, WEIGHTS), 32, progress=False)
    assert weighted == classifier.score(X, LABELS, sample_weight=WEIGHTS)
    assert weighted != classifier.score(X, LABELS)


def test_score_of_a_regressor_is_its_r2():
    regressor = SGDRegressor(random_state=0).fit(X, TARGETS)
    assert score(regressor, labelled(TARGETS), 32, progress=False) == regressor.score(X, TARGETS)
    weighted = score(regressor, labelled(TARGETS, WEIGHTS), 32, nworkers=1, progress=False)
    assert weighted == regressor.score(X, TARGETS, sample_weight=WEIGHTS)


def test_score_of_a_pipeline_is_its_final_step_score():
    pipeline = make_pipeline(StandardScaler(), GaussianNB()).fit(X, LABELS)
    assert score(pipeline, labelled(LABELS), 32, progress=False) == pipeline.score(X, LABELS)


def test_score_of_kmeans_adds_up_its_chunks():
    kmeans = MiniBatchKMeans(n_clusters=3, random_state=0, n_init=1).fit(X)
    # Minus the inertia, a sum over samples: added chunk by chunk, in another order than scikit-learn's,
    # so the last bits may differ.
    assert score(kmeans, lazyseq.view(X), 32, progress=False) == pytest.approx(kmeans.score(X), rel=1e-12)
    weighted = score(kmeans, labelled(LABELS, WEIGHTS), 32, progress=False)
    assert weighted == pytest.approx(kmeans.score(X, sample_weight=WEIGHTS), rel=1e-12)
    assert weighted != pytest.approx(kmeans.score(X), rel=1e-3)


def test_score_of_pca_is_the_mean_of_score_samples():
    pca = PCA(n_components=2).fit(X)
    # The mean of the same per-sample values: only the matrix product in score_samples sees other shapes.
    assert score(pca, lazyseq.view(X), 32, progress=False) == pytest.approx(pca.score(X), rel=1e-12)
    with pytest.raises(TypeError, match="the items of data carry sample weights, but PCA.score takes none"):
        score(pca, labelled(LABELS, WEIGHTS), progress=False)


def test_score_with_a_metric():
    model = GaussianNB().fit(X, LABELS)
    predictions = model.predict(X)
    got = score(model, labelled(LABELS), 32, metric=lambda t, p: f1_score(t, p, average="macro"), progress=False)
    assert got == f1_score(LABELS, predictions, average="macro")
    weighted = score(model, labelled(LABELS, WEIGHTS), 32, metric=mean_absolute_error, progress=False)
    assert weighted == mean_absolute_error(LABELS, predictions, sample_weight=WEIGHTS)


def test_score_errors():
    positive = np.exp(TARGETS / 10)
    glm = PoissonRegressor().fit(X, positive)
    with pytest.raises(TypeError, match="PoissonRegressor.score cannot be computed in chunks.*pass metric="):
        score(glm, labelled(positive))
    with pytest.raises(TypeError, match="^score: IncrementalPCA has no score method, nor predictions to score with"):
        score(IncrementalPCA(2).fit(X), X)  # scikit-learn gives IncrementalPCA no score, unlike PCA (nor predict)

    class Predictor:
        def predict(self, X):
            return np.zeros(len(X))

    with pytest.raises(TypeError, match="^score: Predictor has no score method; pass metric=, for instance metric="):
        score(Predictor(), labelled(TARGETS))
    with pytest.raises(ValueError, match=r"items of data are X alone, but GaussianNB is scored against targets"):
        score(GaussianNB().fit(X, LABELS), X, progress=False)


# -- progress bars and imports ------------------------------------------------------------------------


def test_progress_true_shows_a_bar_of_batches(capsys):
    batches = labelled(LABELS).batch(BATCH)
    fit(GaussianNB(), batches, classes=CLASSES, validation=labelled(LABELS), validate_every=4, progress=True)
    err = capsys.readouterr().err
    assert "fit" in err and "8/8" in err and "batch/s" in err and "score=" in err
    model = GaussianNB().fit(X, LABELS)
    predict(model, X, 32, progress=True)
    assert "predict" in capsys.readouterr().err
    score(model, labelled(LABELS), 32, progress=True)
    err = capsys.readouterr().err
    assert "score" in err and "4/4" in err and "batch/s" in err


def test_progress_false_writes_nothing(capsys):
    model = fit(GaussianNB(), labelled(LABELS).batch(BATCH), classes=CLASSES, validation=labelled(LABELS),
                validate_every=4, progress=False)  # fmt: skip
    predict(model, X, 32, progress=False)
    score(model, labelled(LABELS), 32, progress=False)
    assert capsys.readouterr() == ("", "")


def test_import_lazyseq_imports_neither_this_module_nor_sklearn():
    code = (
        "import sys, lazyseq; assert 'lazyseq.sklearn' not in sys.modules and 'sklearn' not in sys.modules; "
        "import lazyseq.sklearn; assert 'sklearn' not in sys.modules"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_features_given_as_python_lists_are_columns_of_the_batch():
    # A batch collates items' lists position by position: X as a list of WIDTH numbers became a list of WIDTH
    # arrays, one per feature, which partial_fit read as WIDTH rows (IncrementalPCA: BATCH features, 1/BATCH of the
    # samples), silently.
    reference = IncrementalPCA(2)
    for start in range(0, N, BATCH):
        reference.partial_fit(X[start : start + BATCH])
    lists = lazyseq.collate([X.tolist(), LABELS])
    model = fit(IncrementalPCA(2), lists.batch(BATCH), progress=False)
    assert model.n_features_in_ == WIDTH and model.n_samples_seen_ == N
    np.testing.assert_allclose(model.components_, reference.components_)
    torch = pytest.importorskip("torch")
    from torch.utils.data import DataLoader

    from lazyseq.torch import as_dataset

    loader = DataLoader(as_dataset(lists), batch_size=BATCH)  # default_collate: a list of WIDTH tensors
    model = fit(IncrementalPCA(2), loader, progress=False)
    np.testing.assert_allclose(model.components_, reference.components_)
    tensors = lazyseq.smap(lambda x, t: (torch.from_numpy(x), t), X, LABELS)  # tensor rows: stacked
    np.testing.assert_allclose(
        fit(IncrementalPCA(2), tensors.batch(BATCH), progress=False).components_, reference.components_
    )
    reference_model = LinearRegression().fit(X, TARGETS)
    predicted = predict(reference_model, lazyseq.collate([X.tolist(), TARGETS]), batch_size=BATCH, progress=False)
    np.testing.assert_allclose(predicted, reference_model.predict(X))
    square = lazyseq.collate([X[:, :WIDTH].tolist(), LABELS]).batch(WIDTH)  # as many features as rows
    with pytest.raises(ValueError) as info:
        fit(IncrementalPCA(2), square, progress=False)
    assert str(info.value) == (
        f"fit: batch 0: X is a list of {WIDTH} arrays of {WIDTH} values, as many as the targets: the columns of "
        "items whose X is a list (a batch collates them position by position), or rows; make X one array (each "
        "item's X a numpy array, or np.stack the rows)"
    )
    # X as a list of 0-d tensors: its columns stack into tensors, read as rows (transposed, silently)
    square_tensors = lazyseq.view([([torch.tensor(v) for v in row], t) for row, t in zip(X[:WIDTH], LABELS)])
    with pytest.raises(ValueError, match=f"^fit: batch 0: X is a list of {WIDTH} tensors of {WIDTH} values, as many"):
        fit(IncrementalPCA(2), square_tensors.batch(WIDTH), progress=False)


def test_x_and_y_given_whole_say_how_to_batch_them():
    with pytest.raises(TypeError) as info:
        fit(GaussianNB(), (X, LABELS), classes=CLASSES, progress=False)
    assert str(info.value) == (
        "fit: batch 0 is X alone, but GaussianNB.partial_fit needs targets: batches must be (X, y) or "
        "(X, y, sample_weight); batches=(X, y) of whole arrays is read as 2 batches: pass "
        "lazyseq.collate([X, y]).batch(batch_size)"
    )
    with pytest.raises(ValueError) as info:
        fit(
            GaussianNB(),
            labelled(LABELS).batch(BATCH),
            classes=CLASSES,
            validation=(X, LABELS, WEIGHTS),
            progress=False,
        )
    assert str(info.value) == (
        "fit: the items of validation are X alone, but GaussianNB is scored against targets: items must be (X, y) "
        "or (X, y, sample_weight); validation=(X, y, sample_weight) of whole arrays is read as 3 items: pass "
        "lazyseq.collate([X, y, sample_weight])"
    )


def test_a_pair_of_1d_tensors_read_as_rows_says_so():
    torch = pytest.importorskip("torch")
    from torch.utils.data import DataLoader, TensorDataset

    x = torch.linspace(0, 1, 64, dtype=torch.float64)
    with pytest.raises(TypeError) as info:
        fit(SGDRegressor(), DataLoader(TensorDataset(x, 3 * x + 1), batch_size=16), progress=False)
    assert str(info.value) == (
        "fit: batch 0 is X alone, but SGDRegressor.partial_fit needs targets: batches must be (X, y) or "
        "(X, y, sample_weight); a list of 2 1-D tensors of one shape is read as 2 rows of X: for (x, y) with one "
        "feature, make x 2-D (x[:, None])"
    )


def test_x_as_lists_is_read_one_way_through_a_call():
    # Each batch was judged alone: a short last batch with as many rows as features (columns of lists) was refused
    # after every other batch had trained, and a batch of tensor rows as long as its features too.
    count = 3 * BATCH + WIDTH  # the last batch: WIDTH rows of WIDTH features
    lists = lazyseq.collate([X[:count].tolist(), LABELS[:count]])
    reference = GaussianNB().fit(X[:count], LABELS[:count])
    model = fit(GaussianNB(), lists.batch(BATCH), classes=CLASSES, progress=False)
    np.testing.assert_allclose(model.theta_, reference.theta_)
    np.testing.assert_array_equal(predict(model, lists, batch_size=BATCH, progress=False), reference.predict(X[:count]))
    assert score(model, lists, batch_size=BATCH, progress=False) == reference.score(X[:count], LABELS[:count])
    torch = pytest.importorskip("torch")
    tensors = lazyseq.smap(lambda x, t: (torch.from_numpy(x), t), X[:count], LABELS[:count])  # rows as tensors
    model = fit(GaussianNB(), tensors.batch(BATCH), classes=CLASSES, progress=False)
    np.testing.assert_allclose(model.theta_, reference.theta_)
    square = lazyseq.smap(lambda x, t: (torch.from_numpy(x), t), X[:WIDTH], LABELS[:WIDTH]).batch(WIDTH)
    np.testing.assert_allclose(
        fit(GaussianNB(), square, classes=CLASSES, progress=False).theta_,
        GaussianNB().fit(X[:WIDTH], LABELS[:WIDTH]).theta_,
    )


def test_texts_feature_dicts_and_lists_are_rows_as_scikit_learn_reads_them():
    # A batch that is a Python list was read as (X, y, ...): a text pipeline got one text for X ("Iterable over raw
    # text documents expected, string object received"), dicts of features were collated key by key (or refused,
    # keys differing), rows given as lists column by column.
    from sklearn.feature_extraction import DictVectorizer
    from sklearn.feature_extraction.text import CountVectorizer
    from sklearn.linear_model import LogisticRegression
    from sklearn.naive_bayes import MultinomialNB

    words = ["film", "plot", "cast", "movie"]
    docs = [f"{['bad', 'fine', 'good'][label]} {words[i % 4]}" for i, label in enumerate(LABELS)]
    texts = make_pipeline(CountVectorizer(), MultinomialNB()).fit(docs, LABELS)
    expected = texts.predict(docs)
    np.testing.assert_array_equal(texts.predict(np.array(docs)), expected)
    for data in (docs, np.array(docs), lazyseq.view(docs).smap(str.upper)):
        np.testing.assert_array_equal(predict(texts, data, batch_size=BATCH, progress=False), expected)
    assert score(texts, lazyseq.collate([docs, LABELS]), batch_size=BATCH, progress=False) == texts.score(docs, LABELS)

    features = [{"x": float(x), "y": float(y)} if i % 2 else {"x": float(x)} for i, (x, y) in enumerate(X[:, :2])]
    dicts = make_pipeline(DictVectorizer(), LogisticRegression()).fit(features, LABELS)
    np.testing.assert_array_equal(predict(dicts, features, batch_size=BATCH, progress=False), dicts.predict(features))
    pairs = lazyseq.collate([features, LABELS])
    assert score(dicts, pairs, batch_size=BATCH, progress=False) == dicts.score(features, LABELS)

    model = LogisticRegression().fit(X, LABELS)
    np.testing.assert_array_equal(predict(model, X.tolist(), batch_size=BATCH, progress=False), model.predict(X))
    as_lists = [[x, label] for x, label in zip(X, LABELS)]  # a list holding an array: (X, y), as before
    np.testing.assert_array_equal(predict(model, as_lists, batch_size=BATCH, progress=False), model.predict(X))
    assert score(model, as_lists, batch_size=BATCH, progress=False) == model.score(X, LABELS)


def test_an_empty_shard_is_refused_by_predict_and_score_saying_what_to_do():
    # "evaluate: data is empty, so there is nothing to call fn on", from the shard recipe of the guide.
    model = GaussianNB().fit(X, LABELS)
    part = lazyseq.shard(labelled(LABELS)[:3], 3, 4)
    for call, name in [(predict, "predict"), (score, "score")]:
        with pytest.raises(ValueError) as caught:
            call(model, part, progress=False)
        assert str(caught.value) == (
            f"{name}: data is empty, so there is nothing to {name}; a shard (lazyseq.shard) of fewer items than ranks "
            "is empty: skip the call where len(data) == 0"
        )


def test_predict_reads_each_item_once_and_takes_a_one_shot_iterable():
    # Items were told apart by reading item 0 before the batches: computed twice, and a generator could not go back.
    from sklearn.linear_model import LogisticRegression

    x = np.random.default_rng(0).normal(size=(50, 3))
    model = LogisticRegression().fit(x, (x[:, 0] > 0).astype(int))
    expected = model.predict(x)
    once = lazyseq.uniter((row for row in x), size=50)
    np.testing.assert_array_equal(predict(model, once, batch_size=16, progress=False), expected)
    calls = []
    loaded = lazyseq.smap(lambda i: calls.append(i) or x[i], range(50))
    np.testing.assert_array_equal(predict(model, loaded, batch_size=16, progress=False), expected)
    assert calls == list(range(50))


def test_a_vectorizers_sparse_results_come_back_as_one_sparse_matrix():
    # DictVectorizer, OneHotEncoder and the text vectorizers return sparse matrices: refused as not arrays.
    from sklearn.feature_extraction import DictVectorizer
    from sklearn.feature_extraction.text import HashingVectorizer

    rows = [{"a": 1.0}, {"b": 2.0}, {"a": 3.0, "c": 1.0}] * 3
    vectorizer = DictVectorizer().fit(rows)
    features = predict(vectorizer, rows, batch_size=4, method="transform", progress=False)
    assert features.format == "csr" and (features != vectorizer.transform(rows)).nnz == 0
    docs = ["a b c", "b c d", "x y"] * 5
    hashing = HashingVectorizer(n_features=32)
    hashed = predict(hashing, docs, batch_size=4, method="transform", nworkers=2, progress=False)
    assert (hashed != hashing.transform(docs)).nnz == 0


@pytest.mark.parametrize("call", [predict, score])
def test_items_whose_x_are_sparse_rows_are_refused_saying_so(call):
    # scikit-learn was given a list of 1 x 5 sparse matrices: "Expected 2D array, got 1D array instead".
    sparse = pytest.importorskip("scipy.sparse")
    from sklearn.linear_model import SGDClassifier

    x, y = sparse.random(20, 5, density=0.5, format="csr", random_state=0), np.arange(20) % 2
    model = SGDClassifier(random_state=0).fit(x, y)
    items = [(x[i], y[i]) for i in range(20)] if call is score else [x[i] for i in range(20)]
    with pytest.raises(lazyseq.EvaluationError) as caught:
        call(model, items, progress=False)
    assert str(caught.value) == (
        f"failed to compute batch[0]: TypeError: {call.__name__}: the items' X are sparse rows "
        f"({type(x).__name__}), and items are read as dense rows: make each item's X dense (row.toarray()[0]), or "
        "call the estimator on the sparse matrix itself"
    )


def test_tensors_with_a_gradient_are_read_as_arrays():
    # A batch of tensor items, now one tensor, reached scikit-learn as it was: "Can't call numpy() on Tensor that
    # requires grad" (and a tensor on a GPU would not have been read either).
    torch = pytest.importorskip("torch")
    encoded = torch.nn.Linear(WIDTH, WIDTH, dtype=torch.float64)(torch.from_numpy(X))  # with its graph
    rows = lazyseq.view(list(encoded))
    plain = encoded.detach().numpy()
    model = fit(GaussianNB(), lazyseq.collate([rows, LABELS]).batch(BATCH), classes=np.arange(3), progress=False)
    expected = GaussianNB().partial_fit(plain, LABELS, classes=np.arange(3))
    np.testing.assert_allclose(model.theta_, expected.theta_, rtol=1e-12)  # (batch by batch: rounded otherwise)
    np.testing.assert_array_equal(predict(expected, rows, batch_size=BATCH, progress=False), expected.predict(plain))
    assert score(expected, lazyseq.collate([rows, LABELS]), batch_size=BATCH, progress=False) == expected.score(
        plain, LABELS
    )


def test_a_metric_or_a_history_that_cannot_be_used_is_refused_before_any_work():
    # fit trained validate_every steps before failing on metric="accuracy" ('str' object is not callable) or on
    # history={} (no append); score predicted all the data first.
    calls = []

    class Counting(GaussianNB):
        def partial_fit(self, *args, **kwargs):
            calls.append(1)
            return super().partial_fit(*args, **kwargs)

    message = (
        "fit: metric must be a function metric(y_true, y_pred), such as sklearn.metrics.accuracy_score, "
        "not 'accuracy' (a scorer's name is not one)"
    )
    data = labelled(LABELS)
    with pytest.raises(TypeError) as caught:
        fit(Counting(), data.batch(BATCH), classes=CLASSES, validation=data, metric="accuracy", progress=False)
    assert str(caught.value) == message
    with pytest.raises(TypeError) as caught:
        fit(Counting(), data.batch(BATCH), classes=CLASSES, validation=data, history={}, progress=False)
    assert str(caught.value) == "fit: history must be a list, which each validation appends its result to, not dict"
    assert calls == []
    from sklearn.metrics import get_scorer

    with pytest.raises(TypeError, match=r": a scorer takes \(estimator, X, y\); pass its function \(functools"):
        fit(Counting(), data.batch(BATCH), classes=CLASSES, validation=data, metric=get_scorer("accuracy"))
    assert calls == []

    class Log:  # anything that appends
        def __init__(self):
            self.entries = []

        def append(self, entry):
            self.entries.append(entry)

    log = Log()
    fit(GaussianNB(), data.batch(BATCH), classes=CLASSES, validation=data, history=log, progress=False)
    assert [entry["step"] for entry in log.entries] == [8]
    model = GaussianNB().fit(X, LABELS)
    with pytest.raises(TypeError) as caught:
        score(model, lazyseq.smap(lambda item: calls.append(item) or item, data), metric="accuracy")
    assert str(caught.value) == message.replace("fit:", "score:") and calls == []
    with pytest.raises(TypeError, match=r"^fit: epochs must be a positive integer, got 1.5$"):
        fit(GaussianNB(), data.batch(BATCH), classes=CLASSES, epochs=1.5)  # (was a ValueError; 0 still is one)


def test_dummy_estimators_are_scored_as_their_score_does():
    # Refused: their score() takes X=None too, so it is not the mixin's, although it computes the same.
    from sklearn.dummy import DummyClassifier, DummyRegressor

    classifier = DummyClassifier(strategy="most_frequent").fit(X, LABELS)
    regressor = DummyRegressor(strategy="median").fit(X, TARGETS)
    assert score(classifier, labelled(LABELS), 32, progress=False) == classifier.score(X, LABELS)
    assert score(regressor, labelled(TARGETS), 32, progress=False) == pytest.approx(regressor.score(X, TARGETS))


def test_a_regressor_scored_without_its_rule_is_told_of_a_regression_metric():
    glm = PoissonRegressor().fit(X, np.exp(TARGETS / 10))
    with pytest.raises(TypeError, match=r"pass metric=, for instance metric=sklearn\.metrics\.r2_score, to score"):
        score(glm, labelled(np.exp(TARGETS / 10)))


def test_data_that_is_no_sequence_is_named_and_rows_of_one_value_are_explained():
    model = GaussianNB().fit(X, LABELS)
    with pytest.raises(TypeError) as caught:
        predict(model, (row for row in X))
    assert str(caught.value) == (
        "predict: data must be a sequence (with __len__ and __getitem__ by position), not generator: "
        "lazyseq.uniter(iterable, size=n) where its length n is known, or list(iterable) where it ends and fits in "
        "memory"
    )
    with pytest.raises(TypeError, match=r"^fit: validation must be a sequence .*, not int$"):
        fit(GaussianNB(), labelled(LABELS).batch(BATCH), classes=CLASSES, validation=5)
    for data in ([tuple(row) for row in X], X[:, 0]):  # a tuple of numbers is (X, y, ...); a number is no row
        with pytest.raises(ValueError, match="Expected 2D array") as caught:
            predict(model, data, progress=False)
        assert caught.value.__notes__[0].startswith("X holds one value per item (shape (120,)): an item is a row of X")
    from sklearn.isotonic import IsotonicRegression  # takes a 1-D X: its own errors get no note

    isotonic = IsotonicRegression(out_of_bounds="raise").fit(X[:, 0], TARGETS)
    with pytest.raises(ValueError, match="below the interpolation range") as caught:
        predict(isotonic, X[:, 0] - 100, progress=False)
    assert not hasattr(caught.value, "__notes__") or not any("one value per item" in n for n in caught.value.__notes__)
