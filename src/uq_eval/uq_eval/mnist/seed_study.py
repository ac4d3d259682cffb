"""The MNIST benchmark over several training seeds and thread counts (``uq bench mnist
--seeds S ... --threads T ...``).

Each (seed, threads) pair is one whole benchmark run (:func:`uq_eval.mnist.pipeline.
run_benchmark`, its report in ``OUT/seed<S>-threads<T>/``): the seed draws the validation
split and initialises and orders the training of the networks, and the number of torch
threads changes the networks' floating-point sums, so each pair trains different networks.
The study puts the runs side by side: per run the norm-aware NTK-GP's and the deep
ensemble's OOD AUROC on every unknown set, their difference, the NTK-GP's chosen map, its
cost and the exponent the evidence alone would have preferred; then the mean and the worst
case over the runs. The worst case is the figure to quote. A full study trains 25 networks per
thread count; with ``resume`` a study started again reuses the runs it finished before (same
configuration, data and thread count), so it can be completed in parts.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from uq_eval.mnist.data import MnistBenchmarkData
from uq_eval.mnist.pipeline import (
    TARGET_COST_RATIO,
    BenchmarkConfig,
    BenchmarkResult,
    Method,
    run_benchmark,
)

NTK_GP = Method.NTK_GP_NORM
ENSEMBLE = Method.ENSEMBLE


def run_directory(out: Path, seed: int, threads: int) -> Path:
    """Where the report of one run of the study goes."""
    return out / f'seed{seed}-threads{threads}'


def run_row(summary: dict[str, Any]) -> dict[str, Any]:
    """One run's row of the study from its ``results.json`` summary."""
    methods = summary['methods']
    ntk, ensemble = methods[NTK_GP.value], methods[ENSEMBLE.value]
    sets = list(ntk['ood'])
    evidence = summary['feature_alpha_evidence']
    return {
        'seed': summary['config']['seed'],
        'threads': summary['torch_threads'],
        'feature_map': ntk['feature_map'],
        'num_experts': ntk['hyperparameters']['num_experts'],
        'evidence_preferred_alpha': max(evidence, key=lambda e: e['log_evidence'])['alpha'],
        'ntk_gp_auroc': {name: ntk['ood'][name]['auroc'] for name in sets},
        'ensemble_auroc': {name: ensemble['ood'][name]['auroc'] for name in sets},
        'margin': {name: ntk['ood'][name]['auroc'] - ensemble['ood'][name]['auroc']
                   for name in sets},
        'ntk_gp_cost_ratio': ntk['cost_ratio'],
        'ntk_gp_ece': ntk['ece'],
    }


def summarise(rows: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Mean and worst case over the runs (worst: lowest AUROC and margin, highest cost)."""
    if not rows:
        raise ValueError('no runs to summarise')
    sets = list(rows[0]['ntk_gp_auroc'])

    def over(key: str, worst: Callable[[list[float]], float]) -> dict[str, dict[str, float]]:
        return {name: {'mean': sum(r[key][name] for r in rows) / len(rows),
                       'worst': worst([r[key][name] for r in rows])} for name in sets}

    costs = [r['ntk_gp_cost_ratio'] for r in rows]
    margins = over('margin', min)
    return {
        'runs': len(rows),
        'ntk_gp_auroc': over('ntk_gp_auroc', min),
        'ensemble_auroc': over('ensemble_auroc', min),
        'margin': margins,
        'ntk_gp_cost_ratio': {'mean': sum(costs) / len(costs), 'worst': max(costs)},
        'ntk_gp_at_least_ensemble_every_run': {
            name: margins[name]['worst'] >= 0.0 for name in sets},
        'cost_at_most_target_every_run': max(costs) <= TARGET_COST_RATIO,
    }


def study_markdown(rows: Sequence[dict[str, Any]], summary: dict[str, Any]) -> str:
    """The study as Markdown: one row per run, then the mean and the worst case."""
    sets = list(rows[0]['ntk_gp_auroc'])
    header = (['seed', 'threads', 'map (alpha, s, M)', 'evidence prefers alpha']
              + [f'NTK-GP {n}' for n in sets] + [f'ensemble {n}' for n in sets]
              + [f'margin {n}' for n in sets] + ['NTK-GP cost x fwd'])
    lines = ['| ' + ' | '.join(header) + ' |', '|' + '---|' * len(header)]
    for r in rows:
        fmap = r['feature_map']
        cells = ([str(r['seed']), str(r['threads']),
                  f"{fmap['alpha']:g}, {fmap['scale']:g}, {r['num_experts']}",
                  f"{r['evidence_preferred_alpha']:g}"]
                 + [f"{r['ntk_gp_auroc'][n]:.3f}" for n in sets]
                 + [f"{r['ensemble_auroc'][n]:.3f}" for n in sets]
                 + [f"{r['margin'][n]:+.3f}" for n in sets]
                 + [f"{r['ntk_gp_cost_ratio']:.2f}"])
        lines.append('| ' + ' | '.join(cells) + ' |')
    for kind in ('mean', 'worst'):
        cells = ([f'**{kind}**', '', '', '']
                 + [f"{summary['ntk_gp_auroc'][n][kind]:.3f}" for n in sets]
                 + [f"{summary['ensemble_auroc'][n][kind]:.3f}" for n in sets]
                 + [f"{summary['margin'][n][kind]:+.3f}" for n in sets]
                 + [f"{summary['ntk_gp_cost_ratio'][kind]:.2f}"])
        lines.append('| ' + ' | '.join(cells) + ' |')
    met = summary['ntk_gp_at_least_ensemble_every_run']
    verdict = ', '.join(f"{n} {'met' if ok else 'missed'}" for n, ok in met.items())
    cost = 'met' if summary['cost_at_most_target_every_run'] else 'missed'
    return ('\n'.join(lines) + '\n\n'
            f"NTK-GP (norm-aware) AUROC >= deep ensemble in every run ({summary['runs']} "
            f"runs; worst case): {verdict}. Cost <= {TARGET_COST_RATIO:g}x forward in every "
            f"run: {cost}. Worst: lowest AUROC and margin, highest cost over the runs.\n")


def finished_row(directory: Path, data: MnistBenchmarkData, config: BenchmarkConfig,
                 threads: int) -> dict[str, Any] | None:
    """The row of a run already in ``directory``, if it was made with this configuration,
    data and thread count (``None`` otherwise, or if there is no readable report)."""
    try:
        summary = json.loads((directory / 'results.json').read_text())
        made_with = {k: v for k, v in summary['config'].items() if k != 'progress'}
        same = (made_with == _plain({k: v for k, v in dataclasses.asdict(config).items()
                                     if k != 'progress'})
                and summary['torch_threads'] == threads
                and summary['data']['data_dir'] == str(data.data_dir)
                and summary['data']['extra_ood_files'] == {
                    name: str(path) for name, path in data.extra_ood_paths.items()})
        return run_row(summary) if same else None
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _plain(value: Any) -> Any:
    """``value`` as it reads back from JSON (tuples become lists)."""
    return json.loads(json.dumps(value))


def run_seed_study(data: MnistBenchmarkData, config: BenchmarkConfig, seeds: Sequence[int],
                   threads: Sequence[int], out: Path,
                   write_report: Callable[[BenchmarkResult, Path], Any],
                   set_threads: Callable[[int], None],
                   log: Callable[[str], None] = lambda line: None,
                   resume: bool = False) -> dict[str, Any]:
    """Run the benchmark for every (seed, threads) pair and write the study.

    Parameters
    ----------
    data, config
        As for :func:`~uq_eval.mnist.pipeline.run_benchmark`; ``config.seed`` is replaced
        by each seed.
    seeds, threads
        The training seeds and torch thread counts; every pair is run, seeds outermost.
    out
        Directory of the study (``seed_study.json``, ``seed_study.md``) and of each run's
        report (:func:`run_directory`).
    write_report
        Writes one run's report into a directory (``uq_eval.mnist.report.write_report``).
    set_threads
        Sets the number of torch threads (``torch.set_num_threads``).
    log
        Receives a line per finished run.
    resume
        Reuse a run whose report is already in its directory, made with the same
        configuration, data and thread count (:func:`finished_row`), instead of running it
        again.

    Returns
    -------
    dict
        ``{'rows': [...], 'summary': {...}}`` as written to ``seed_study.json``.
    """
    if not seeds or not threads:
        raise ValueError('the study needs at least one seed and one thread count')
    rows = []
    for seed in seeds:
        for count in threads:
            run_config = dataclasses.replace(config, seed=seed)
            directory = run_directory(out, seed, count)
            row = finished_row(directory, data, run_config, count) if resume else None
            if row is None:
                set_threads(count)
                result = run_benchmark(data, run_config)
                write_report(result, directory)
                row = run_row(result.summary)
                done = 'ran'
            else:
                done = f'reused {directory}'
            rows.append(row)
            margins = ', '.join(f'{n} {m:+.3f}' for n, m in row['margin'].items())
            log(f'seed {seed}, {count} thread(s) ({done}): NTK-GP - ensemble AUROC {margins}')
            # Written after every run, so an interrupted study keeps what it finished.
            _write(out, rows)
    return _write(out, rows)


def _write(out: Path, rows: list[dict[str, Any]]) -> dict[str, Any]:
    summary = summarise(rows)
    out.mkdir(parents=True, exist_ok=True)
    study = {'rows': rows, 'summary': summary}
    (out / 'seed_study.json').write_text(json.dumps(study, indent=1) + '\n')
    (out / 'seed_study.md').write_text(study_markdown(rows, summary))
    return study
