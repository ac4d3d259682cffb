"""Write the MNIST uncertainty benchmark's JSON, markdown table and plots (ROS-free)."""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from uq_eval.mnist.pipeline import (
    IN_DISTRIBUTION,
    NTK_GP_METHODS,
    BenchmarkResult,
    Method,
    Score,
)
from uq_perception.training import metrics

__all__ = ['markdown_table', 'write_report']

_SCORE_LABELS = {
    Score.ONE_MINUS_MAX_PROB.value: '1 - max p',
    Score.ENTROPY.value: 'predictive entropy',
    Score.MUTUAL_INFORMATION.value: 'mutual information',
    Score.GP_VARIANCE.value: 'GP variance',
}


def _ood_names(summary: Mapping[str, Any]) -> list[str]:
    """The unknown sets of the run, built-in ones first, then those added with --ood."""
    return list(summary['data']['ood_images'])


def _methods(summary: Mapping[str, Any]) -> list[Method]:
    """The methods of the run (the laplace-torch rows only where the library was installed)."""
    return [Method(key) for key in summary['methods']]


def _fmt(value: float, digits: int) -> str:
    return 'n/a' if value is None or not math.isfinite(value) else f'{value:.{digits}f}'


def markdown_table(summary: Mapping[str, Any]) -> str:
    """The main results table (one row per method) as GitHub markdown.

    Parameters
    ----------
    summary : mapping
        ``BenchmarkResult.summary``.
    """
    sets = _ood_names(summary)
    header = (['Method', 'Acc. %', 'NLL', 'Brier', 'ECE']
              + [f'AUROC {s}' for s in sets] + [f'AUPR {s}' for s in sets]
              + ['Misclass. AUROC', 'Cost x fwd', 'OOD score'])
    lines = ['| ' + ' | '.join(header) + ' |', '|' + '---|' * len(header)]
    best = summary['targets']['best_baseline_ood_auroc']
    for method in _methods(summary):
        r = summary['methods'][method.value]
        aurocs = []
        for s in sets:
            cell = _fmt(r['ood'][s]['auroc'], 3)
            # Mark where an NTK-GP variant reaches the best baseline (the OOD AUROC target of
            # docs/benchmarks.md, "The NTK-GP against the targets").
            if method in NTK_GP_METHODS and r['ood'][s]['auroc'] >= best[s]:
                cell = f'**{cell}**'
            aurocs.append(cell)
        row = ([r['label'], _fmt(100 * r['accuracy'], 2), _fmt(r['nll'], 4),
                _fmt(r['brier'], 4), _fmt(r['ece'], 4)] + aurocs
               + [_fmt(r['ood'][s]['aupr'], 3) for s in sets]
               + [_fmt(r['misclassification_auroc'], 3), _fmt(r['cost_ratio'], 2),
                  _SCORE_LABELS[r['ood_score']]])
        lines.append('| ' + ' | '.join(row) + ' |')
    return '\n'.join(lines) + '\n'


def _score_table(summary: Mapping[str, Any]) -> str:
    sets = _ood_names(summary)
    lines = ['| Method | Score | ' + ' | '.join(f'AUROC {s}' for s in sets) + ' |',
             '|---|---|' + '---|' * len(sets)]
    for method in _methods(summary):
        r = summary['methods'][method.value]
        for score, per_set in r['score_auroc'].items():
            mark = ' (primary)' if score == r['ood_score'] else ''
            lines.append(f"| {r['label']} | {_SCORE_LABELS[score]}{mark} | "
                         + ' | '.join(_fmt(per_set[s], 3) for s in sets) + ' |')
    return '\n'.join(lines) + '\n'


def _targets_text(summary: Mapping[str, Any]) -> str:
    lines = []
    targets = summary['targets']
    for method in NTK_GP_METHODS:
        r = summary['methods'][method.value]
        t = targets[method.value]
        ood = ', '.join(
            f"{s} {r['ood'][s]['auroc']:.3f} vs {targets['best_baseline_ood_auroc'][s]:.3f} "
            f"({'met' if ok else 'missed'})"
            for s, ok in t['ood_auroc_at_least_best_baseline'].items())
        lines.append(
            f"- {r['label']}: OOD AUROC >= best baseline: {ood}; "
            f"ECE {r['ece']:.4f} <= 0.01 {'met' if t['ece_at_most_0.01'] else 'missed'}; "
            f"cost {r['cost_ratio']:.2f}x <= 1.1x "
            f"{'met' if t['cost_at_most_1.1x_forward'] else 'missed'}.")
    return '\n'.join(lines) + '\n'


def _hyperparameter_text(summary: Mapping[str, Any]) -> str:
    methods = summary['methods']
    lines = [f"- Temperature scaling: T = {methods[Method.TEMPERATURE.value]['temperature']:.3f}"]
    for method in NTK_GP_METHODS:
        h = methods[method.value]['hyperparameters']
        flags = ', '.join(f'{k} {100 * v:.1f}%' for k, v in
                          methods[method.value]['ood_flag_rate'].items())
        lines.append(
            f"- {methods[method.value]['label']}: lambda = {h['probit_lambda']:.4g}, "
            f"T = {h['temperature']:.3f}, OOD threshold = {h['ood_threshold']:.4g} "
            f"(flagged: {flags})")
    for r in methods.values():
        if 'laplace' in r:
            lap = r['laplace']
            edge = ' (at the edge of the grid)' if lap['prior_precision_at_grid_edge'] else ''
            lines.append(f"- {r['label']}: prior precision = {lap['prior_precision']:.4g}"
                         f"{edge}, by {lap['prior_precision_search']}")
    selection = ', '.join(
        f"M={s['num_experts']}: {s['validation_nll']:.5f}"
        + (f" (+- {s['standard_error_to_best']:.5f}{', chosen' if s['chosen'] else ''})"
           if 'chosen' in s else '')
        for s in summary['expert_selection'])
    lines.append(f'- Validation NLL per number of experts (M>1 row: the smallest M within one '
                 f'standard error of the best): {selection}')
    evidence = ', '.join(f"alpha={e['alpha']:g}: {e['log_evidence']:.0f}"
                         for e in summary['feature_alpha_evidence'])
    lines.append(f'- Norm-aware map: alpha fixed at '
                 f"{summary['config']['feature_alpha']:g}; log evidence of each alpha at the "
                 f'chosen scale and experts (not a choice): {evidence}')
    return '\n'.join(lines) + '\n'


def _diagnostics_text(summary: Mapping[str, Any]) -> str:
    diag = summary['diagnostics']
    names = [IN_DISTRIBUTION, *_ood_names(summary)]
    lines = ['| Quantity | ' + ' | '.join(names) + ' |', '|---|' + '---|' * len(names),
             '| mean feature norm of phi | '
             + ' | '.join(_fmt(diag['feature_norm_mean'][n], 2) for n in names) + ' |',
             '| AUROC of squared norm of [phi; 1] | - | '
             + ' | '.join(_fmt(diag['auroc_squared_feature_norm'][n], 3) for n in names[1:])
             + ' |']
    for method in NTK_GP_METHODS:
        key = f'auroc_gp_variance_over_squared_norm_{method.value}'
        label = summary['methods'][method.value]['label']
        lines.append(f'| AUROC of GP variance / squared norm, {label} | - | '
                     + ' | '.join(_fmt(diag[key][n], 3) for n in names[1:]) + ' |')
    return '\n'.join(lines) + '\n'


def _laplace_text(summary: Mapping[str, Any]) -> str:
    laplace = summary['laplace']
    if laplace['skipped'] is not None:
        return f"laplace-torch peer-baseline rows skipped: {laplace['skipped']}.\n\n"
    return (f"laplace-torch rows: laplace-torch {laplace['version']}, the library's own API "
            '(GLM predictive, probit link; prior precision by its grid search of the '
            'validation NLL).\n\n')


def results_markdown(summary: Mapping[str, Any]) -> str:
    """The complete ``results.md``: table, target checks, hyperparameters, other scores."""
    data = summary['data']
    runtime = summary['runtime_seconds']
    return (
        '# MNIST uncertainty benchmark\n\n'
        f"In-distribution: MNIST test ({data['test_images']} images); unknown: "
        + ', '.join(f'{k} ({v})' for k, v in data['ood_images'].items())
        + f". Networks trained on {data['train_images']} MNIST training images; "
        f"{data['validation_images']} held out for every fitted hyperparameter. "
        f"Cost: median CPU time of {summary['config']['timing_rounds']} calls on a batch of "
        f"{summary['config']['timing_batch']} MNIST test images (after warm-up), relative to "
        'one forward pass of the network timed the same way in the same run.\n\n'
        + markdown_table(summary)
        + '\nBold: an NTK-GP AUROC at least the best baseline on that set.\n\n'
        + _laplace_text(summary)
        + '## Targets (NTK-GP)\n\n' + _targets_text(summary)
        + '\n## Hyperparameters (fitted on the validation split)\n\n'
        + _hyperparameter_text(summary)
        + '\n## OOD AUROC of every available score\n\n' + _score_table(summary)
        + '\n## Diagnostics (after the fact; not methods of the benchmark)\n\n'
        + _diagnostics_text(summary)
        + '\nCost of the NTK-GP variance alone (no probit probabilities, no entropy '
        f"decomposition), M=1: {summary['ntk_gp_variance_only_cost_ratio']:.3f}x forward.\n"
        + f"\nRun time: {runtime['total']:.0f} s (training {runtime['training']:.0f} s, "
        f"validation fitting {runtime['validation_fitting']:.0f} s, of which laplace-torch "
        f"{runtime['laplace_fitting']:.0f} s, evaluation "
        f"{runtime['evaluation']:.0f} s, timing {runtime['timing']:.0f} s) with "
        f"{summary['torch_threads']} torch thread(s).\n")


def _plot_reliability(result: BenchmarkResult, path: Path) -> None:
    import matplotlib
    matplotlib.use('Agg')
    import matplotlib.pyplot as plt

    methods = list(result.test_probabilities)
    cols = 4
    rows = -(-len(methods) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(10, 2.7 * rows), sharex=True, sharey=True)
    flat = axes.ravel()
    n_bins = 15
    centres = (np.arange(n_bins) + 0.5) / n_bins
    for ax, method in zip(flat, methods, strict=False):
        probs = result.test_probabilities[method]
        conf, acc, counts = metrics.reliability_bins(probs, result.test_labels, n_bins)
        filled = counts > 0
        ax.bar(centres[filled], acc[filled], width=1 / n_bins, edgecolor='k', linewidth=0.4,
               color='tab:blue', label='accuracy')
        # The gap spans accuracy to mean confidence, above (overconfident) or inside the bar.
        ax.bar(centres[filled], np.abs(conf - acc)[filled],
               bottom=np.minimum(conf, acc)[filled], width=1 / n_bins, color='mistyrose',
               edgecolor='tab:red', hatch='//', linewidth=0.4, label='gap to confidence')
        ax.plot([0, 1], [0, 1], 'k--', linewidth=0.8)
        label = result.summary['methods'][method.value]['label']
        ece = result.summary['methods'][method.value]['ece']
        ax.set_title(f'{label}\nECE {ece:.4f}', fontsize=8)
        ax.tick_params(labelsize=7)
    for ax in flat[len(methods):]:
        ax.axis('off')
    flat[0].legend(fontsize=6, loc='upper left')
    fig.supxlabel('confidence (max probability)', fontsize=8)
    fig.supylabel('accuracy', fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=72)
    plt.close(fig)


def _plot_histograms(result: BenchmarkResult, path: Path) -> None:
    import matplotlib
    matplotlib.use('Agg')
    import matplotlib.pyplot as plt

    methods = list(result.ood_scores)
    cols = 4
    rows = -(-len(methods) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(10, 2.7 * rows))
    flat = axes.ravel()
    # The built-in sets keep their colours; sets added with --ood take the next ones.
    palette = ('tab:orange', 'tab:green', 'tab:purple', 'tab:red', 'tab:brown', 'tab:pink',
               'tab:olive', 'tab:cyan', 'tab:blue', 'tab:gray')
    colours = {IN_DISTRIBUTION: 'k', **{name: palette[i % len(palette)]
                                        for i, name in enumerate(_ood_names(result.summary))}}
    for ax, method in zip(flat, methods, strict=False):
        per_set = result.ood_scores[method]
        score = result.summary['methods'][method.value]['ood_score']
        values = np.concatenate(list(per_set.values()))
        # GP variances span orders of magnitude: histogram them on a log axis.
        log_axis = score == Score.GP_VARIANCE.value
        if log_axis:
            positive = values[values > 0]
            low = positive.min() if positive.size else 1e-12
            edges = np.geomspace(low, max(values.max(), low * 10), 40)
            ax.set_xscale('log')
        else:
            edges = np.linspace(0.0, max(values.max(), 1e-9), 40)
        for name, v in per_set.items():
            ax.hist(np.clip(v, edges[0], edges[-1]), bins=edges, histtype='step', density=True,
                    color=colours[name], label=name, linewidth=1.0)
        ax.set_yscale('log')
        ax.set_title(f"{result.summary['methods'][method.value]['label']}\n"
                     f'{_SCORE_LABELS[score]}', fontsize=8)
        ax.tick_params(labelsize=7)
    for ax in flat[len(methods):]:
        ax.axis('off')
    handles, labels = flat[0].get_legend_handles_labels()
    flat[-1].legend(handles, labels, fontsize=8, loc='center')
    fig.supylabel('density (log)', fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=72)
    plt.close(fig)


def write_report(result: BenchmarkResult, out_dir: str | Path) -> dict[str, Path]:
    """Write ``results.json``, ``results.md``, ``reliability.png`` and ``histograms.png``.

    Parameters
    ----------
    result : BenchmarkResult
        Output of :func:`~uq_eval.mnist.pipeline.run_benchmark`.
    out_dir : path-like
        Created if missing.

    Returns
    -------
    dict of str to Path
        The written files by kind.
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = {
        'json': out / 'results.json',
        'markdown': out / 'results.md',
        'reliability': out / 'reliability.png',
        'histograms': out / 'histograms.png',
    }
    # allow_nan=False: a NaN would be invalid JSON; the pipeline must not produce one.
    paths['json'].write_text(json.dumps(result.summary, indent=2, allow_nan=False) + '\n')
    paths['markdown'].write_text(results_markdown(result.summary))
    _plot_reliability(result, paths['reliability'])
    _plot_histograms(result, paths['histograms'])
    return paths
