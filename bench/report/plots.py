"""The PNG plots of a run (matplotlib, loaded only when a plot is drawn)."""

from __future__ import annotations

import math
from collections import Counter, defaultdict
from pathlib import Path

from ..suites import entry_of
from .csvio import num
from .view import REF, Run

# What a bar's absence means, by the row's status (a variant with no row on a problem
# did not run there).
_MISSING = {"skipped": "skipped", "fail": "failed", "error": "error",
            "unsupported": "unsupported", "": "not run"}


def _plt():
  import matplotlib  # noqa: PLC0415
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt  # noqa: PLC0415
  return plt


def plot_size(run: Run, path: Path) -> bool:
  """TFLOP/s against size, one panel per backend, each with XLA's dot."""
  suite = "square" if "square" in run.suites else (run.suites[0] if run.suites else None)
  if suite is None or not run.backend_variants:
    return False
  plt = _plt()
  bs = list(run.backend_variants)
  fig, axes = plt.subplots(1, len(bs), figsize=(5.5 * len(bs), 4.2), squeeze=False)
  refs = [r for r in run.problems(suite) if r["status"] == "ok"]

  def size(r):
    return (num(r["m"]) * num(r["k"]) * num(r["n"])) ** (1 / 3)

  for ax, b in zip(axes[0], bs):
    refs_sorted = sorted(refs, key=size)
    ax.plot([size(r) for r in refs_sorted], [num(r["tflops"]) for r in refs_sorted], "k--o",
            label="XLA dot", linewidth=2, markersize=4)
    for v in run.backend_variants[b]:
      pts = sorted(((size(r), num(r["tflops"])) for r in run.gemm
                    if r["suite"] == suite and r["backend"] == b and r["variant"] == v
                    and r["status"] == "ok"))
      if pts:
        ax.plot(*zip(*pts), "-o", label=v, markersize=3)
    _autoscale(ax, [y for line in ax.get_lines() for y in line.get_ydata()])
    ax.set_xscale("log", base=2)
    ax.set_xlabel("size (M*K*N)^(1/3)" if suite != "square" else "M = K = N")
    ax.set_ylabel("TFLOP/s")
    ax.set_title(f"{b}: {suite} suite, {run.first.get('dtype', '')}")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
  _save(fig, run, path)
  return True


def plot_ladder(run: Run, path: Path) -> bool:
  """Each backend's rungs on the ladder problems (a panel per backend): a bar per variant
  that ran there, XLA's dot in black; a missing bar is labelled with why (skipped, failed,
  unsupported), and the panel's title counts them."""
  ladder = [r for r in run.gemm if r["backend"] == REF and r.get("ladder") == "1"]
  if not ladder or not run.backend_variants:
    return False
  plt = _plt()

  def rows_of(b, v, ref):
    return [r for r in run.kernel_rows(ref["suite"], ref["problem"])
            if r["backend"] == b and r["variant"] == v]

  # Only the variants that have rows on the ladder problems (not another op's variants).
  panels = {b: [v for v in vs if any(rows_of(b, v, ref) for ref in ladder)]
            for b, vs in run.backend_variants.items()}
  panels = {b: vs for b, vs in panels.items() if vs}
  if not panels:
    return False
  fig, axes = plt.subplots(len(panels), 1, figsize=(max(7, 1.8 * len(ladder) + 3),
                                                    3.6 * len(panels)), squeeze=False)
  for ax, (b, vs) in zip(axes[:, 0], panels.items()):
    labels = ["XLA dot", *vs]
    width = 0.8 / len(labels)
    all_ys, missing, marks = [], Counter(), []
    for i, lab in enumerate(labels):
      ys = []
      for j, ref in enumerate(ladder):
        x = j + (i - (len(labels) - 1) / 2) * width
        if lab == "XLA dot":
          ys.append(num(ref["tflops"]) if ref["status"] == "ok" else 0)
          continue
        rr = rows_of(b, lab, ref)
        ok = [r for r in rr if r["status"] == "ok" and num(r["tflops"])]
        ys.append(num(ok[0]["tflops"]) if ok else 0)
        if not ok:
          status = rr[0]["status"] if rr else ""
          why = _MISSING.get(status, status)
          missing[why] += 1
          marks.append((x, why))
      xs = [j + (i - (len(labels) - 1) / 2) * width for j in range(len(ladder))]
      ax.bar(xs, ys, width, label=lab, color="black" if lab == "XLA dot" else None)
      all_ys += ys
    _autoscale(ax, all_ys)
    bottom = ax.get_ylim()[0]
    for x, why in marks:     # the reason where the bar would be
      ax.text(x, bottom, f" {why}", rotation=90, ha="center", va="bottom", fontsize=6,
              color="0.35")
    ax.set_xticks(range(len(ladder)))
    several_dtypes = len({r["dtype"] for r in ladder}) > 1   # a merged run's (as the tables)
    ax.set_xticklabels([f"{r['problem']}\n{r['m']}x{r['k']}x{r['n']}"
                        + (f"\n{r['dtype']}" if several_dtypes else "") for r in ladder],
                       fontsize=7)
    ax.set_ylabel("TFLOP/s")
    gone = ", ".join(f"{n} {why}" for why, n in missing.most_common())
    ax.set_title(f"kernel ladder: {b}" + (f" (no bar: {gone})" if gone else ""))
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.005, 1), borderaxespad=0)
    ax.grid(axis="y", alpha=0.3)
  _save(fig, run, path)
  return True


def plot_ratio(run: Run, path: Path, suite: str = "llm") -> bool:
  refs = run.problems(suite)
  if not refs or not (run.backend_variants or run.has_auto):
    return False
  plt = _plt()
  fig, ax = plt.subplots(figsize=(max(8, 0.28 * len(refs) + 3), 4.5))
  for b in run.backend_variants:
    ys = []
    for r in refs:
      best = run.best(suite, r["problem"], [b])
      ys.append(num(best["speedup_vs_xla"]) if best else float("nan"))
    ax.plot(range(len(refs)), ys, "o-", label=f"{b} (best variant)", markersize=4)
  ys = [num(a["speedup_vs_xla"]) if (a := run.auto(suite, r["problem"])) and a["status"] == "ok"
        else float("nan") for r in refs]
  if any(math.isfinite(y) for y in ys):
    ax.plot(range(len(refs)), ys, "s-", color="black", label="default (backend='auto')",
            markersize=4)
  ax.axhline(1.0, color="black", linestyle="--", linewidth=1)
  ax.set_xticks(range(len(refs)))
  ax.set_xticklabels([r["problem"] for r in refs], rotation=75, fontsize=6, ha="right")
  ax.set_ylabel("speedup vs XLA dot (>1: faster)")
  ax.set_title(f"{suite} suite: each backend's best variant, and the default, against XLA's dot")
  ax.grid(alpha=0.3)
  ax.legend(fontsize=8)
  _save(fig, run, path)
  return True


def plot_bandwidth(run: Run, path: Path) -> bool:
  refs = [r for r in run.problems("skinny") if r["status"] == "ok"]
  if not refs:
    return False
  plt = _plt()
  fig, ax = plt.subplots(figsize=(7.5, 4.2))
  groups = defaultdict(list)
  for r in refs:
    groups[(r["k"], r["n"])].append(r)
  for (k, n), rs in groups.items():
    rs.sort(key=lambda r: num(r["m"]))
    ax.plot([num(r["m"]) for r in rs], [num(r["gbps"]) for r in rs], "k--o", markersize=3,
            label=f"XLA K={k} N={n}")
    for b in run.backend_variants:
      pts = [(num(r["m"]), num(x["gbps"])) for r in rs
             if (x := run.best("skinny", r["problem"], [b])) is not None]
      if pts:
        ax.plot(*zip(*pts), "-o", markersize=3, label=f"{b} K={k} N={n}")
  bw = run.copy_bw()
  if bw:
    ax.axhline(bw, color="red", linewidth=1, label=f"measured copy {bw:.0f} GB/s")
  ax.set_xscale("log", base=2)
  ax.set_xlabel("M (tokens)")
  ax.set_ylabel("GB/s (operands read once, output written once)")
  ax.set_title("skinny (decode) suite: achieved bandwidth")
  ax.grid(alpha=0.3)
  ax.legend(fontsize=6)
  _save(fig, run, path)
  return True


def plot_training(run: Run, path: Path) -> bool:
  """The loss per step of each training model (a panel per model: the dense model, the
  MoE, SwiGLU and FP8 ones), XLA's trajectory thick and grey under the others."""
  by_model: dict[str, dict[str, list]] = defaultdict(lambda: defaultdict(list))
  labels = {}
  for r in run.rows:
    if r["kind"] == "train_loss":
      who = (entry_of(r["suite"]).train_ref_label if r["backend"] == REF
             else f"{r['backend']}/{r['variant']}")
      by_model[r["problem"]][who].append((int(num(r["step"])), num(r["loss"])))
      labels[r["problem"]] = r["suite"]
  if not by_model:
    return False
  plt = _plt()
  fig, axes = plt.subplots(len(by_model), 1, figsize=(9, 3.3 * len(by_model)), squeeze=False)
  colors = plt.get_cmap("tab10").colors
  markers = "os^vD<>ph*"
  for ax, (model, lines) in zip(axes[:, 0], by_model.items()):
    others = 0
    for who, pts in lines.items():
      pts.sort()
      if who == entry_of(labels[model]).train_ref_label:
        style = dict(color="0.55", linewidth=4, alpha=0.6, zorder=1)
      else:   # distinct within the panel: its own colour and marker
        style = dict(color=colors[others % len(colors)], linewidth=1.2,
                     marker=markers[others % len(markers)], markersize=3.5,
                     markevery=max(1, len(pts) // 12), zorder=2)
        others += 1
      ax.plot(*zip(*pts), label=who, **style)
    ax.xaxis.get_major_locator().set_params(integer=True)   # steps
    ax.set_xlabel("step")
    ax.set_ylabel("training loss")
    ax.set_title(f"training loss of {model} (suite {labels[model]}): jaxgemm's GEMMs vs XLA's, "
                 "same init and data", fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.005, 1), borderaxespad=0)
  _save(fig, run, path)
  return True


def _autoscale(ax, values):
  """Log y when the values span more than two decades (e.g. interpreters vs XLA)."""
  v = [x for x in values if x and x > 0]
  if v and max(v) / min(v) > 100:
    ax.set_yscale("log")


def _save(fig, run: Run, path: Path) -> None:
  """Writes the figure with the run's title; `bbox_inches="tight"` keeps legends placed
  outside the axes inside the image."""
  plt = _plt()
  _title(fig, run)
  fig.tight_layout()
  fig.savefig(path, dpi=110, bbox_inches="tight")
  plt.close(fig)


def _title(fig, run: Run):
  f = run.first
  tag = "" if run.on_gpu else "NOT GPU TIMINGS (CPU) - "
  fig.suptitle(f"{tag}{f.get('device', '')}, jax {f.get('jax', '')}, {f.get('timer', '')}",
               fontsize=8, y=0.995)


PLOTS = {
    "tflops_vs_size.png": ("TFLOP/s against size, per backend, with XLA's dot", plot_size),
    "ladder.png": ("The kernel ladder (every variant on the ladder problems)", plot_ladder),
    "llm_ratio.png": ("Speedup against XLA across the llm suite", plot_ratio),
    "skinny_bandwidth.png": ("Achieved bandwidth on the skinny (decode) suite", plot_bandwidth),
    "training_loss.png": ("Training loss trajectories", plot_training),
}

