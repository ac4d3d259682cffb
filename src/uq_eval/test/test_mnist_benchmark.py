"""`uq bench mnist`: data loading, building blocks and the reduced end-to-end run."""

from __future__ import annotations

import dataclasses
import gzip
import json
import math
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import torch

from uq_common import cli
from uq_eval.mnist.cnn import SmallCNN, mc_dropout_probabilities, to_tensor
from uq_eval.mnist.data import (
    OOD_SETS,
    configured_data_dir,
    default_data_dir,
    load_benchmark_data,
    read_idx,
    read_npz_images,
    write_idx,
)
from uq_eval.mnist.laplace import laplace_version
from uq_eval.mnist.pipeline import (
    LAPLACE_VARIANTS,
    METHOD_LABELS,
    BenchmarkConfig,
    BenchmarkResult,
    Method,
    fit_temperature,
    one_standard_error_choice,
)


@pytest.fixture
def one_thread() -> Iterator[None]:
    # Two threads on a busy 2-core machine spin against each other; restore afterwards so
    # other tests keep the process default.
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


def _write_synthetic(root: Path, n_train: int = 2600, n_test: int = 600) -> None:
    """A tiny dataset in the benchmark layout: a bright square whose position is the digit."""
    rng = np.random.default_rng(0)

    def digits(n: int) -> tuple[np.ndarray, np.ndarray]:
        labels = rng.integers(0, 10, n).astype(np.uint8)
        images = rng.integers(0, 40, (n, 28, 28)).astype(np.uint8)
        for i, label in enumerate(labels):
            r, c = divmod(int(label), 5)
            images[i, 4 + 10 * r:12 + 10 * r, 1 + 5 * c:6 + 5 * c] = 250
        # Relabel 10 %, so that even a perfect classifier makes mistakes to detect.
        noisy = rng.random(n) < 0.1
        labels[noisy] = rng.integers(0, 10, int(noisy.sum()))
        return images, labels

    (root / 'mnist').mkdir(parents=True)
    for split, n in (('train', n_train), ('t10k', n_test)):
        images, labels = digits(n)
        write_idx(root / 'mnist' / f'{split}-images-idx3-ubyte.gz', images)
        write_idx(root / 'mnist' / f'{split}-labels-idx1-ubyte.gz', labels)
    for alternatives in OOD_SETS.values():
        path = root / alternatives[0]
        path.parent.mkdir(parents=True, exist_ok=True)
        write_idx(path, rng.integers(0, 256, (n_test, 28, 28)).astype(np.uint8))


@pytest.fixture(params=['mnist', 'synthetic'])
def data_dir(request: pytest.FixtureRequest, tmp_path: Path) -> Path:
    """The benchmark's data, one run each: ``mnist`` is the real data where ``uq bench mnist``
    finds it by default (``$UQ_DATA_DIR``, else the workspace's ``data/``) and is skipped,
    naming what is missing, without it; ``synthetic`` is a generated set in the same
    layout, so that the whole command runs everywhere."""
    if request.param == 'synthetic':
        _write_synthetic(tmp_path / 'data')
        return tmp_path / 'data'
    try:
        root = default_data_dir()
        load_benchmark_data(root)  # a malformed file raises ValueError: a failure
    except FileNotFoundError as err:
        pytest.skip(f'MNIST benchmark data missing: {err}. `uq data fetch all` downloads '
                    'it into the data directory.')
    return root


# --------------------------------------------------------------------------- data


def test_idx_round_trip_gzipped_and_plain(tmp_path: Path) -> None:
    images = np.arange(2 * 3 * 4, dtype=np.uint8).reshape(2, 3, 4)
    write_idx(tmp_path / 'a-idx3-ubyte.gz', images)
    write_idx(tmp_path / 'b-idx3-ubyte', images)
    with gzip.open(tmp_path / 'a-idx3-ubyte.gz', 'rb') as f:
        assert f.read(4) == bytes([0, 0, 8, 3])  # magic 2051: ubyte, 3 dimensions
    np.testing.assert_array_equal(read_idx(tmp_path / 'a-idx3-ubyte.gz'), images)
    np.testing.assert_array_equal(read_idx(tmp_path / 'b-idx3-ubyte'), images)


def test_read_idx_rejects_malformed_files(tmp_path: Path) -> None:
    (tmp_path / 'float').write_bytes(bytes([0, 0, 0x0D, 1]) + (1).to_bytes(4, 'big') + b'\0' * 4)
    with pytest.raises(ValueError, match='not an unsigned-byte idx'):
        read_idx(tmp_path / 'float')
    (tmp_path / 'short').write_bytes(bytes([0, 0, 8, 1]) + (5).to_bytes(4, 'big') + b'\0' * 3)
    with pytest.raises(ValueError, match=r'declares shape \(5,\)'):
        read_idx(tmp_path / 'short')


def test_read_npz_images(tmp_path: Path) -> None:
    images = np.ones((3, 28, 28), dtype=np.uint8)
    np.savez_compressed(tmp_path / 'imgs.npz', images)
    np.testing.assert_array_equal(read_npz_images(tmp_path / 'imgs.npz'), images)
    np.savez(tmp_path / 'two.npz', images, images)
    with pytest.raises(ValueError, match='expected one array'):
        read_npz_images(tmp_path / 'two.npz')


def test_missing_files_are_all_named(tmp_path: Path, capsys: pytest.CaptureFixture[str]
                                     ) -> None:
    (tmp_path / 'mnist').mkdir()
    write_idx(tmp_path / 'mnist' / 'train-images-idx3-ubyte',
              np.zeros((2, 28, 28), dtype=np.uint8))
    with pytest.raises(FileNotFoundError) as info:
        load_benchmark_data(tmp_path)
    message = str(info.value)
    assert 'lacks 6 file(s)' in message
    assert f'uq data fetch all --data-dir {tmp_path}' in message
    for name in ('mnist/train-labels-idx1-ubyte.gz', 'mnist/t10k-images-idx3-ubyte.gz',
                 'mnist/t10k-labels-idx1-ubyte.gz', 'fashion_mnist/t10k-images-idx3-ubyte.gz',
                 'kmnist/kmnist-test-imgs.npz', 'notmnist/t10k-images-idx3-ubyte.gz'):
        assert name in message
    # The uncompressed train images were accepted, so they are not reported.
    assert 'train-images' not in message
    code = cli.main(['bench', 'mnist', '--data-dir', str(tmp_path), '--out',
                     str(tmp_path / 'out'), '--no-progress'])
    assert code == 2
    assert 'notmnist/t10k-images-idx3-ubyte.gz' in capsys.readouterr().err


def test_default_data_dir_prefers_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch
                                              ) -> None:
    monkeypatch.setenv('UQ_DATA_DIR', str(tmp_path))
    assert default_data_dir() == tmp_path.resolve()


def test_default_data_dir_without_environment_is_the_workspace_data_folder(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv('UQ_DATA_DIR', raising=False)
    monkeypatch.delenv('UQ_WORKSPACE', raising=False)
    # This checkout's root is three levels above this file.
    expected = Path(__file__).resolve().parents[3] / 'data'
    assert configured_data_dir() == (expected, 'the workspace default')
    try:
        assert default_data_dir() == expected.resolve()
    except FileNotFoundError as err:
        assert not expected.is_dir() and f'{expected} (the workspace default)' in str(err)
        assert 'uq data fetch all' in str(err)


def test_default_data_dir_follows_the_workspace_and_names_a_missing_folder(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv('UQ_DATA_DIR', raising=False)
    monkeypatch.setenv('UQ_WORKSPACE', str(tmp_path))
    with pytest.raises(FileNotFoundError, match='uq data fetch all'):
        default_data_dir()
    (tmp_path / 'data').mkdir()
    assert default_data_dir() == (tmp_path / 'data').resolve()
    # A UQ_DATA_DIR that does not exist is an error, not a reason to look elsewhere.
    monkeypatch.setenv('UQ_DATA_DIR', str(tmp_path / 'elsewhere'))
    with pytest.raises(FileNotFoundError, match=r'elsewhere \(\$UQ_DATA_DIR\) does not exist'):
        default_data_dir()


# --------------------------------------------------------------------------- building blocks


def test_fit_temperature_recovers_the_generating_temperature() -> None:
    rng = np.random.default_rng(1)
    logits = rng.normal(0.0, 4.0, (20000, 5))
    z = logits / 2.5
    p = np.exp(z - z.max(axis=1, keepdims=True))
    p /= p.sum(axis=1, keepdims=True)
    labels = (p.cumsum(axis=1) > rng.random((len(p), 1))).argmax(axis=1)
    assert fit_temperature(logits, labels) == pytest.approx(2.5, rel=0.05)
    with pytest.raises(ValueError, match='need logits'):
        fit_temperature(logits, labels[:-1])


def test_mc_dropout_matches_the_network_and_repeats_with_its_seed() -> None:
    torch.manual_seed(0)
    x = to_tensor(np.random.default_rng(0).integers(0, 256, (8, 28, 28), dtype=np.uint8),
                  0.13, 0.31)
    exact = SmallCNN(conv_dropout=0.0, head_dropout=0.0).eval()
    with torch.no_grad():
        reference = torch.softmax(exact(x), dim=1).numpy()
    draws = mc_dropout_probabilities(exact, x, 3, torch.Generator().manual_seed(0))
    np.testing.assert_allclose(draws, np.broadcast_to(reference, draws.shape), atol=1e-6)

    model = SmallCNN().eval()
    a = mc_dropout_probabilities(model, x, 4, torch.Generator().manual_seed(5))
    b = mc_dropout_probabilities(model, x, 4, torch.Generator().manual_seed(5))
    np.testing.assert_array_equal(a, b)
    assert not np.allclose(a[0], a[1])  # each pass draws new masks
    np.testing.assert_allclose(a.sum(axis=2), 1.0, atol=1e-5)


def test_config_validation() -> None:
    with pytest.raises(ValueError, match='expert_candidates'):
        BenchmarkConfig(expert_candidates=(1, 4))
    with pytest.raises(ValueError, match='ood_quantile'):
        BenchmarkConfig(ood_quantile=1.0)
    with pytest.raises(ValueError, match='epochs'):
        BenchmarkConfig(epochs=0)
    with pytest.raises(ValueError, match='feature_alpha'):
        BenchmarkConfig(feature_alpha=math.nan)


# --------------------------------------------------------------------------- end to end


@pytest.mark.slow
def test_quick_benchmark_produces_every_method_and_metric(
        data_dir: Path, tmp_path: Path, one_thread: None,
        capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / 'out'
    # An extra unknown set given as floats in [0, 1]: uniform noise, which every method
    # should find foreign.
    noise = np.random.default_rng(7).random((300, 28, 28)).astype(np.float32)
    np.savez(tmp_path / 'noise.npz', images=noise, labels=np.zeros(300))
    code = cli.main(['bench', 'mnist', '--quick', '--data-dir', str(data_dir), '--out',
                     str(out), '--no-progress', '--threads', '1',
                     '--ood', f"Noise={tmp_path / 'noise.npz'}"])
    assert code == 0
    summary = json.loads((out / 'results.json').read_text())
    methods = summary['methods']
    # The laplace-torch rows are there exactly when the optional library is installed.
    version = laplace_version()
    expected = {m for m in Method if version is not None or m not in LAPLACE_VARIANTS}
    assert set(methods) == {m.value for m in expected}
    assert summary['laplace']['version'] == version
    if version is None:
        assert 'make laplace' in summary['laplace']['skipped']
        assert 'laplace-torch rows skipped' in capsys.readouterr().err
    else:
        lap = methods[Method.LAPLACE_LAST_LAYER.value]['laplace']
        assert (lap['version'], lap['subset_of_weights'], lap['predictive'],
                lap['link_approx']) == (version, 'last_layer', 'glm', 'probit')
        assert lap['prior_precision'] > 0
    ood_names = [*OOD_SETS, 'Noise']
    assert list(summary['data']['ood_images']) == ood_names
    assert summary['data']['ood_images']['Noise'] == 300
    assert summary['data']['extra_ood_files'] == {'Noise': str(tmp_path / 'noise.npz')}
    unit = ('accuracy', 'brier', 'ece', 'misclassification_auroc')
    for name, r in methods.items():
        for key in unit:
            assert math.isfinite(r[key]), (name, key)
        assert 0.0 <= r['accuracy'] <= 1.0 and 0.0 <= r['ece'] <= 1.0
        assert 0.0 <= r['brier'] <= 2.0 and 0.0 <= r['misclassification_auroc'] <= 1.0
        assert math.isfinite(r['nll']) and r['nll'] >= 0.0
        assert math.isfinite(r['cost_ratio']) and r['cost_ratio'] > 0.0
        for key in ('cost_ratio_wall_median', 'cost_ratio_wall_best', 'cpu_ms_per_image'):
            assert math.isfinite(r[key]) and r[key] > 0.0, (name, key)
        assert list(r['ood']) == ood_names
        assert list(r['score_auroc'][r['ood_score']]) == ood_names
        for per_set in r['ood'].values():
            assert 0.0 <= per_set['auroc'] <= 1.0 and 0.0 <= per_set['aupr'] <= 1.0
        # One epoch on a subset still learns: far above the 10 % of guessing.
        assert r['accuracy'] > 0.5, name
        # Uniform noise looks nothing like a digit (the quick run gave 0.93 and more).
        assert r['ood']['Noise']['auroc'] > 0.8, name
    for method in (Method.NTK_GP_1, Method.NTK_GP_M, Method.NTK_GP_NORM):
        r = methods[method.value]
        # The GP variance is the NTK-GP's OOD score, and it must rank a clearly foreign set
        # (notMNIST letters; uniform noise in the synthetic layout) above MNIST: a constant
        # variance gives 0.5, an inverted one near 0 (the quick run here gave 0.98).
        assert r['ood_score'] == 'gp_variance'
        for name, per_set in r['ood'].items():
            assert per_set['auroc'] == r['score_auroc']['gp_variance'][name]
        assert r['ood']['notMNIST']['auroc'] > 0.8, (method, r['ood'])
        # ... and flag more of it than of MNIST, whose flag rate the threshold sets.
        assert r['ood_flag_rate']['notMNIST'] > 2 * r['ood_flag_rate']['MNIST'], method
        h = r['hyperparameters']
        assert all(math.isfinite(v) and v > 0 for v in h['sigma2'] + h['delta'])
        assert math.isfinite(h['ood_threshold']) and h['temperature'] > 0
        assert set(methods[method.value]['score_auroc']) == {
            'one_minus_max_prob', 'predictive_entropy', 'mutual_information', 'gp_variance'}
    assert methods[Method.NTK_GP_1.value]['hyperparameters']['num_experts'] == 1
    assert methods[Method.NTK_GP_M.value]['hyperparameters']['num_experts'] in (2, 4)
    assert methods[Method.TEMPERATURE.value]['temperature'] > 0
    assert summary['data']['test_images'] == 500
    assert all(summary['data']['ood_images'][n] == 500 for n in OOD_SETS)
    norm = methods[Method.NTK_GP_NORM.value]
    # The exponent is fixed; the scale and the experts are the evidence's best.
    candidates = summary['feature_map_selection']
    best = max(candidates, key=lambda c: c['log_evidence'])
    assert len(candidates) == 1 * 1 * 2 and {c['alpha'] for c in candidates} == {2.0}
    assert (norm['feature_map']['alpha'], norm['feature_map']['scale'],
            norm['hyperparameters']['num_experts']) == (2.0, best['scale'], best['num_experts'])
    # The other exponents' evidence is reported at the chosen scale and experts.
    evidence = {e['alpha']: e['log_evidence'] for e in summary['feature_alpha_evidence']}
    assert set(evidence) == {0.0, 1.0, 2.0} and evidence[2.0] == best['log_evidence']
    # The M>1 row: the smallest count within one standard error of the best validation NLL.
    multi = [s for s in summary['expert_selection'] if s['num_experts'] > 1]
    chosen = [s['num_experts'] for s in multi if s['chosen']]
    assert chosen == [methods[Method.NTK_GP_M.value]['hyperparameters']['num_experts']]
    best_nll = min(s['validation_nll'] for s in multi)
    assert all(s['validation_nll'] - best_nll > s['standard_error_to_best']
               for s in multi if s['num_experts'] < chosen[0])
    assert set(summary['targets']) == {'best_baseline_ood_auroc', 'ntk_gp_1', 'ntk_gp_m',
                                       'ntk_gp_norm'}
    assert list(summary['targets']['best_baseline_ood_auroc']) == ood_names

    markdown = (out / 'results.md').read_text()
    assert '| AUROC Noise |' in markdown and '| AUPR Noise |' in markdown
    for method in expected:
        label = methods[method.value]['label']
        assert f'| {label} |' in markdown
    assert METHOD_LABELS[Method.ENSEMBLE] in markdown
    for plot in ('reliability.png', 'histograms.png'):
        assert (out / plot).read_bytes()[:8] == b'\x89PNG\r\n\x1a\n'


# --------------------------------------------------------------------------- selection rules


def test_one_standard_error_rule_takes_the_simplest_candidate_the_data_cannot_tell_apart(
        ) -> None:
    rng = np.random.default_rng(0)
    base = rng.exponential(0.05, 2000)
    noise = rng.normal(0.0, 0.01, 2000)
    # 8 is best by a hair, 2 and 4 are within one standard error of it: 2 is chosen.
    close = {2: base + 0.0002 + noise, 4: base + 0.0001 - noise, 8: base}
    choice, errors = one_standard_error_choice(close)
    assert choice == 2 and errors[8] == 0.0 and errors[2] > 0.0002
    # 2 is clearly worse (a shift of ten standard errors): the next simplest, 4, is chosen.
    far = {2: base + 0.01 + noise, 4: base + 0.0001 - noise, 8: base}
    assert one_standard_error_choice(far)[0] == 4
    # The order of the mapping does not matter, only the candidates' values.
    assert one_standard_error_choice(dict(reversed(list(far.items()))))[0] == 4
    with pytest.raises(ValueError, match='no candidates'):
        one_standard_error_choice({})
    with pytest.raises(ValueError, match='N >= 2'):
        one_standard_error_choice({2: base, 4: base[:10]})


def test_bench_mnist_arguments_seeds_threads_and_the_old_seed_spelling() -> None:
    import argparse

    from uq_eval.mnist.benchmark import configure

    parser = argparse.ArgumentParser()
    configure(parser)
    args = parser.parse_args([])
    assert (args.seeds, args.threads) == ([0], [1])
    args = parser.parse_args(['--seeds', '0', '1', '2', '--threads', '1', '2'])
    assert (args.seeds, args.threads) == ([0, 1, 2], [1, 2])
    assert parser.parse_args(['--seed', '3']).seeds == [3]
    for bad in (['--threads', '0'], ['--seeds', '-1'], ['--seeds']):
        with pytest.raises(SystemExit):
            parser.parse_args(bad)


@pytest.mark.slow
def test_seed_study_runs_every_pair_and_reports_mean_and_worst_case(
        tmp_path: Path, one_thread: None) -> None:
    from uq_eval.mnist.seed_study import finished_row, run_directory, run_seed_study

    def write_summary(result: BenchmarkResult, directory: Path) -> None:
        # The summary alone: the full report (plots) is the quick benchmark test's subject.
        directory.mkdir(parents=True)
        (directory / 'results.json').write_text(json.dumps(result.summary))

    _write_synthetic(tmp_path / 'data', n_train=700, n_test=200)
    data = load_benchmark_data(tmp_path / 'data')
    config = BenchmarkConfig(epochs=1, batch_size=64, validation_size=200, train_size=400,
                             test_size=100, ood_size=100, expert_candidates=(2,),
                             feature_expert_counts=(1, 2), laplace=False, timing_batch=32,
                             timing_rounds=1, timing_warmup=0, progress=False)
    out = tmp_path / 'study'
    lines: list[str] = []
    study = run_seed_study(data, config, [0, 1], [1, 2], out, write_summary,
                           torch.set_num_threads, log=lines.append)
    rows = study['rows']
    assert [(r['seed'], r['threads']) for r in rows] == [(0, 1), (0, 2), (1, 1), (1, 2)]
    assert len(lines) == 4
    for row in rows:
        report = json.loads((run_directory(out, row['seed'], row['threads'])
                             / 'results.json').read_text())
        ntk = report['methods'][Method.NTK_GP_NORM.value]
        assert row['ntk_gp_auroc'] == {n: v['auroc'] for n, v in ntk['ood'].items()}
        assert row['feature_map']['alpha'] == 2.0
        for name in OOD_SETS:
            assert row['margin'][name] == pytest.approx(
                row['ntk_gp_auroc'][name] - row['ensemble_auroc'][name])
    summary = study['summary']
    for name in OOD_SETS:
        values = [r['ntk_gp_auroc'][name] for r in rows]
        assert summary['ntk_gp_auroc'][name] == {'mean': pytest.approx(np.mean(values)),
                                                 'worst': min(values)}
        assert summary['ntk_gp_at_least_ensemble_every_run'][name] == (
            min(r['margin'][name] for r in rows) >= 0.0)
    assert summary['ntk_gp_cost_ratio']['worst'] == max(r['ntk_gp_cost_ratio'] for r in rows)
    assert json.loads((out / 'seed_study.json').read_text()) == study
    markdown = (out / 'seed_study.md').read_text()
    assert markdown.count('\n| 0 | ') == 2 and '| **worst** |' in markdown

    # Started again with resume, the study reuses every finished run and trains nothing.
    def no_training(count: int) -> None:
        raise AssertionError(f'a finished run was run again ({count} threads)')

    again = run_seed_study(data, config, [0, 1], [1, 2], out, write_summary, no_training,
                           resume=True)
    assert again == study
    # A run is reused only with the same settings, thread count and data, and a readable
    # report.
    directory = run_directory(out, 0, 1)
    seed0 = dataclasses.replace(config, seed=0)
    assert finished_row(directory, data, seed0, 1) == rows[0]
    assert finished_row(directory, data, dataclasses.replace(seed0, epochs=2), 1) is None
    assert finished_row(directory, data, seed0, 2) is None
    assert finished_row(directory, data.with_extra_ood({'Noise': (tmp_path / 'n.npz', np.zeros(
        (2, 28, 28), np.uint8))}), seed0, 1) is None
    (directory / 'results.json').write_text('{"config": ')
    assert finished_row(directory, data, seed0, 1) is None
