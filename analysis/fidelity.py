"""docs/fidelity.md from results folders: fedray next to the authors' code, cell by cell.

A spec (YAML, ``docs/fidelity.yaml``) names the sections; each reads one results folder
(both sides, the reference's runs marked by their ``source``) and lays out, per setting and
algorithm: fedray's mean ± std over seeds, the reference's, their difference, whether they agree,
both wall times per run, and the paper's number where the budget is the paper's. Two means agree
when |mean(fedray) - mean(reference)| <= max(1.0 point, 2 x the standard error of the difference);
a side with one seed takes the other side's seed variance for its own; with one seed a side the
table gives the difference and no verdict.
Everything but the spec's prose is computed from the Parquet files, so the page is regenerated,
never typed: ``fedray fidelity docs/fidelity.yaml``.

Spec::

    title: ...
    intro: |                       # markdown, as is
    root: /work/runs               # where relative `results` folders are (--root overrides)
    sections:
      - title: ...
        results: fidelity-fedconcat
        text: |                    # markdown before the table (the setting, the budget, the commands)
        read: {stage: classifier, round: 57}   # how each run is read (as `fedray report`); default final
        by: [momentum, lr]         # optional: more config fields that tell cells apart (columns of the table)
        where: {lr: 0.06}          # optional: only the runs whose config has these values (a list: one of
                                   # them) (a folder that also holds another study's runs, e.g. an lr grid)
        tuned: [lr]                # optional: config keys tuned per cell, as the papers tune each algorithm:
                                   # each side's cell is its best setting of them (`tuned_choice`), and a
                                   # second table gives every setting's mean
        tuned_by: {metric: accuracy}   # optional: choose that setting on another reading than `read`
                                   # (purity at the lr each algorithm's accuracy picked)
        paper: {"#C=2": {fedavg: 79.0, fedconcat: 84.4}}   # the paper's means, where the budget is its own
        notes: |                   # markdown after the table (causes found, what changed)
        curves: fidelity-fedconcat-curves.png   # optional: accuracy curves, written next to the page
        names: {fedcat: FedCat, "fedcat concatenation=false": "FedCat w/ GC"}   # optional: an algorithm
                                   # with its non-default hp ("ALG k=v,...") under a name of its own
        claims:                    # optional: a paper's orderings, checked per partition on each source's runs
          - {claim: "Table 1: FedCat above every baseline", above: [FedCat], below: [FedAvg, FedProx]}
        study: layercfl            # optional: a study's own tables and figures (analysis.layer_study)
        study_options: {rounds: [1, 10, 30], size: 500, prefix: fidelity-layercfl}

A section whose results folder is gone (results live on the machine that ran them) can be kept as
it was last generated: ``render(..., previous=the current page)`` (``fedray fidelity --keep-missing``)
copies it from there, marked as such; without it a missing folder is an error.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pandas as pd

from analysis.load import diverged, load_runs
from analysis.report import (
    ReportError,
    field_label,
    flat_config,
    hp_pairs,
    run_flat,
    run_values,
    tuned_choice,
    value_text,
)
from fedray.sweeps.choosing import parse_at

FEDRAY = "fedray"
AGREE_POINTS = 1.0  # percentage points


class FidelityError(ValueError):
    """The spec is malformed or names a folder that does not exist."""


def agreement(a: Any, b: Any) -> dict[str, float | bool]:
    """Means, stds, difference, standard error of the difference and the agreement rule for two
    samples of per-seed values (fractions; the rule is in percentage points)."""
    a, b = pd.Series(a, dtype=float).dropna() * 100, pd.Series(b, dtype=float).dropna() * 100
    out: dict[str, float | bool] = {
        "mean_a": a.mean(),
        "std_a": a.std(ddof=1) if len(a) > 1 else math.nan,
        "n_a": len(a),
        "mean_b": b.mean(),
        "std_b": b.std(ddof=1) if len(b) > 1 else math.nan,
        "n_b": len(b),
    }
    out["diff"] = out["mean_a"] - out["mean_b"]
    # a side with one seed has no spread of its own: it borrows the other side's seed variance (the
    # two systems run the same method, so their seeds scatter alike); with one seed on both, none
    va = a.var(ddof=1) if len(a) > 1 else (b.var(ddof=1) if len(b) > 1 else 0.0)
    vb = b.var(ddof=1) if len(b) > 1 else (a.var(ddof=1) if len(a) > 1 else 0.0)
    var = (va / len(a) if len(a) else 0.0) + (vb / len(b) if len(b) else 0.0)
    out["se"] = math.sqrt(var)
    out["tolerance"] = max(AGREE_POINTS, 2 * out["se"])
    out["agree"] = bool(len(a) and len(b) and abs(out["diff"]) <= out["tolerance"])
    return out


def algorithm_label(
    config: Mapping[str, Any], names: Mapping[str, str] | None, apart: list[str] | tuple[str, ...] = ()
) -> str:
    """The algorithm as a section names it: with ``names``, the algorithm and its non-default hp
    (``fedcat concatenation=false``) looked up there (itself when absent); else the algorithm. The
    hp keys a section tells cells apart by or tunes (``hp.mu`` in its ``by`` or ``tuned``) are not
    part of the name: they have their own column, or are the setting."""
    if names is None:
        return field_label(dict(config), "algorithm")
    skip = {k[3:] for k in apart if k.startswith("hp.")}
    key = " ".join([config["algorithm"], *(p for p in hp_pairs(config) if p.split("=", 1)[0] not in skip)])
    return str(names.get(key, key))


def selected(runs: pd.DataFrame, where: Mapping[str, Any] | None) -> pd.DataFrame:
    """The runs whose config has every ``where`` value (keys as `fedray report` flattens them:
    ``lr``, ``hp.mu``), or one of the values where it is a list (``algorithm: [fedavg, fedrc]``); a
    key no run has is an error (a typo would otherwise empty the section)."""
    if not where or runs.empty:
        return runs
    flats = [flat_config(c) for c in runs["config"]]
    for key in where:
        if not any(key in f for f in flats):
            raise FidelityError(f"where: no run has the config key {key!r}")

    def ok(have: Any, want: Any) -> bool:  # a list is one of its values, unless the key's own value is a list
        return have == want or (isinstance(want, list) and not isinstance(have, list) and have in want)

    keep = [all(ok(f.get(k), v) for k, v in where.items()) for f in flats]
    return runs[keep]


def cells(
    results: str | Path,
    read: Mapping[str, Any] | None = None,
    by: list[str] | tuple[str, ...] = (),
    names: Mapping[str, str] | None = None,
    where: Mapping[str, Any] | None = None,
    tuned: list[str] | tuple[str, ...] = (),
    tuned_by: Mapping[str, Any] | None = None,
) -> pd.DataFrame:
    """One row per (partition, algorithm, the ``by`` fields, source) with the per-seed values and
    wall times of the finished runs that did not diverge, and how many runs diverged (fedray stops
    such a run on non-finite metrics; the reference trains on through NaN weights, its summary's
    ``diverged_round``, and is left out of the values the same way): a cell whose every run diverged
    is still a row. ``names``: see `algorithm_label`; ``where``: see `selected`. With ``tuned``
    (config keys, e.g. ``["lr"]``), runs that differ there share a cell, which holds the runs of its
    best setting (`tuned_choice`): its ``setting`` names it (``lr=0.03``), and ``grid`` maps every
    setting to its (values, diverged). ``tuned_by`` (a reading, as ``read``): the setting is chosen on
    that reading of the runs instead (each algorithm's lr picked by accuracy, its purity read there);
    ``grid`` still shows ``read``'s values."""
    read, by, tuned = dict(read or {}), list(by), list(tuned)
    if tuned_by is not None and not tuned:
        raise FidelityError("tuned_by chooses the setting of a tuned cell: the section needs tuned: [...]")
    keys = ["partition", "algorithm", *by, "source"]
    columns = [*keys, "values", "seconds", "rounds", "diverged", *(["setting", "grid"] if tuned else [])]
    try:
        values = run_values(
            results,
            read.get("metric", "accuracy"),
            read.get("at", "final"),
            read.get("round"),
            read.get("stage"),
        )
        picks = (
            values
            if tuned_by is None
            else run_values(
                results,
                tuned_by.get("metric", "accuracy"),
                tuned_by.get("at", "final"),
                tuned_by.get("round"),
                tuned_by.get("stage"),
            )
        )
    except ReportError as e:
        raise FidelityError(f"{results}: {e}") from None
    runs = selected(load_runs(results), where)
    if runs.empty:
        return pd.DataFrame(columns=columns)
    runs["diverged"] = [diverged(r) for r in runs.itertuples()]
    runs = runs[runs["diverged"] | (runs["status"] == "finished")]
    if runs.empty:
        return pd.DataFrame(columns=columns)
    try:
        runs["algorithm"] = runs["config"].map(lambda c: algorithm_label(c, names, [*by, *tuned]))
        for name in (k for k in keys if k != "algorithm"):
            runs[name] = runs["config"].map(lambda c, n=name: field_label(c, n))
    except ReportError as e:
        raise FidelityError(f"{results}: by: {e}") from None
    if tuned:
        flats = [flat_config(c) for c in runs["config"]]
        for key in tuned:
            if key in by or not any(key in f for f in flats):
                raise FidelityError(
                    f"tuned: {key!r} is " + ("also in by:" if key in by else "no run's config key")
                )
        used = [
            run_flat(c, sm.get("hparams") if isinstance(sm, dict) else None)
            for c, sm in zip(runs["config"], runs["summary"], strict=True)
        ]
        runs["setting"] = [
            " ".join(f"{k}={value_text(f[k]) if k in f else 'default'}" for k in tuned) for f in used
        ]
    read_at, pick_at = values.set_index("run_id"), picks.set_index("run_id")

    def one(g: pd.DataFrame) -> dict[str, Any]:
        ok = [r for r, d in zip(g["run_id"], g["diverged"], strict=True) if r in read_at.index and not d]
        summary = g.set_index("run_id")["summary"]
        return {
            "values": [read_at.loc[r, "value"] for r in ok],
            "seconds": [summary[r].get("total_seconds", math.nan) for r in ok],
            "rounds": [read_at.loc[r, "round"] for r in ok],
            "diverged": int(g["diverged"].sum()),
        }

    def pick(g: pd.DataFrame) -> tuple[list[float], int]:
        """What a setting is chosen on: its runs' ``tuned_by`` values (by default ``read``'s)."""
        ok = [r for r, d in zip(g["run_id"], g["diverged"], strict=True) if r in pick_at.index and not d]
        return [pick_at.loc[r, "value"] for r in ok], int(g["diverged"].sum())

    rows = []
    for key, g in runs.groupby(keys, sort=False):
        if not tuned:
            rows.append({**dict(zip(keys, key, strict=True)), **one(g)})
            continue
        groups = dict(list(g.groupby("setting", sort=False)))
        settings = {s: one(gs) for s, gs in groups.items()}
        best = tuned_choice({s: pick(gs) for s, gs in groups.items()})
        rows.append(
            {
                **dict(zip(keys, key, strict=True)),
                **settings[best],
                "setting": best,
                "grid": {s: (v["values"], v["diverged"]) for s, v in settings.items()},
            }
        )
    return pd.DataFrame(rows, columns=columns)


def _pm(mean: float, std: float, n: int) -> str:
    if n == 0 or math.isnan(mean):
        return "-"
    return f"{mean:.1f} ± {std:.1f} ({n})" if n > 1 and not math.isnan(std) else f"{mean:.1f} ({n})"


def _secs(values: list[float]) -> str:
    v = [x for x in values if not math.isnan(x)]
    if not v:
        return "-"
    m = sum(v) / len(v)
    return f"{m / 60:.1f} min" if m >= 60 else f"{m:.0f} s"


def section_table(
    c: pd.DataFrame,
    paper: Mapping[str, Mapping[str, float]] | None = None,
    by: list[str] | tuple[str, ...] = (),
) -> pd.DataFrame:
    """The comparison table of one section: fedray vs every reference source, per cell."""
    paper, by = paper or {}, list(by)
    with_reference = bool((c["source"] != FEDRAY).any())  # a fedray-only section has no reference columns
    rows = []
    for key, cell in c.groupby(["partition", "algorithm", *by], sort=False):
        part, alg, extra = key[0], key[1], dict(zip(by, key[2:], strict=True))
        by_source = {s: r for s, r in zip(cell["source"], cell.itertuples(), strict=True)}
        mine = by_source.get(FEDRAY)
        refs = [s for s in by_source if s != FEDRAY] or [None]
        for src in refs:
            ref = by_source.get(src) if src else None
            a = pd.Series(mine.values if mine is not None else [], dtype=float)
            b = pd.Series(ref.values if ref is not None else [], dtype=float)
            s = agreement(a, b)
            row = {
                "partition": part,
                "algorithm": alg,
                **extra,
                "fedray": _pm(s["mean_a"], s["std_a"], s["n_a"]),
            }
            if "setting" in c:  # a tuned section: each side's best setting
                row["fedray's setting"] = mine.setting if mine is not None else "-"
            if with_reference:
                row["reference"] = _pm(s["mean_b"], s["std_b"], s["n_b"]) + (f" [{src}]" if src else "")
                if "setting" in c:
                    row["reference's setting"] = ref.setting if ref is not None else "-"
                if s["n_a"] and s["n_b"]:
                    row["difference"] = f"{s['diff']:+.1f}"
                    row["agree (tolerance)"] = (
                        "- (one seed a side)"  # no seed-to-seed spread known on either side
                        if s["n_a"] == 1 and s["n_b"] == 1
                        else f"{'yes' if s['agree'] else 'NO'} (±{s['tolerance']:.1f})"
                    )
                else:
                    row["difference"] = row["agree (tolerance)"] = "-"
            diverged = (mine.diverged if mine is not None else 0, ref.diverged if ref is not None else 0)
            if c["diverged"].any() and with_reference:
                row["diverged (fedray, reference)"] = f"{diverged[0]}, {diverged[1]}"
            elif c["diverged"].any():
                row["diverged"] = str(diverged[0])
            row["fedray time/run"] = _secs(mine.seconds) if mine is not None else "-"
            if with_reference:
                row["reference time/run"] = _secs(ref.seconds) if ref is not None else "-"
            p = paper.get(part, {}).get(alg)
            if p is not None:
                row["paper"] = p if isinstance(p, str) else f"{p:.1f}"
            rows.append(row)
    table = pd.DataFrame(rows)
    if "paper" in table:
        table["paper"] = table["paper"].fillna("-")
    return table


def setting_order(setting: str) -> tuple:
    """Sort key of a tuned setting (``lr=0.01 hp.mu=1``): by its values, numbers as numbers."""

    def value(v: str) -> tuple:
        try:
            return (0, float(v), "")
        except ValueError:
            return (1, 0.0, v)

    return tuple(value(pair.split("=", 1)[-1]) for pair in setting.split(" "))


def grid_table(c: pd.DataFrame, by: list[str] | tuple[str, ...] = ()) -> pd.DataFrame:
    """A tuned section's every setting: one row per cell and source, one column per setting, each
    its mean ± std over seeds (and how many runs diverged), the setting the cell took in bold."""
    settings = sorted(dict.fromkeys(s for g in c["grid"] for s in g), key=setting_order)
    rows = []
    for r in c.to_dict("records"):
        row = {
            "partition": r["partition"],
            "algorithm": r["algorithm"],
            **{b: r[b] for b in by},
            "source": r["source"],
        }
        for name in settings:
            if name not in r["grid"]:
                row[name] = "-"
                continue
            values, lost = r["grid"][name]
            v = pd.Series(values, dtype=float).dropna() * 100
            text = _pm(v.mean() if len(v) else math.nan, v.std(ddof=1) if len(v) > 1 else math.nan, len(v))
            text += f", {lost} diverged" if lost else ""
            row[name] = f"**{text}**" if name == r["setting"] else text
        rows.append(row)
    return pd.DataFrame(rows)


def claim_table(
    c: pd.DataFrame, claims: list[Mapping[str, Any]], by: list[str] | tuple[str, ...] = ()
) -> pd.DataFrame:
    """A paper's orderings, per source (fedray first, then each reference whose runs are there) and
    partition: ``above`` every one of ``below`` in the mean. Each pair's difference with twice its
    standard error; the verdict: ``holds`` (every pair above by more than 2 SE), ``holds in the
    means`` (above, some within 2 SE), ``does not hold`` (some pair below in the mean; named),
    ``not run`` (a cell has no finished run). A source with none of the claim's algorithms in a
    partition has no row there. ``references: pooled`` reads the references as one side, each
    algorithm from the reference that ran it (FedLC from FL-bench against FedAvg from NIID-Bench,
    on the same clients); two references with the same algorithm in a partition are an error.
    In a section with ``by`` fields an algorithm can have several cells in a partition (FedRS with
    and without a head bias): a claim names one as ``FedRS head_bias=false`` (the ``by`` fields as
    ``key=value``); a bare name with several cells there is an error, never a silent pick."""
    rows = []
    by = list(by)
    qualified = c["algorithm"].astype(str)
    for b in by:
        qualified = qualified + f" {b}=" + c[b].astype(str)
    c = c.assign(qualified=qualified)
    for claim in claims:
        above, below = _names(claim.get("above")), _names(claim.get("below"))
        if not above or not below:
            raise FidelityError(f"claim {claim.get('claim')!r}: needs above: and below: (algorithm names)")
        if claim.get("references", "each") not in ("each", "pooled"):
            raise FidelityError(f"claim {claim.get('claim')!r}: references: is each or pooled")
        # a bare name no cell has is an algorithm not run yet ("not run"); a cell named with by-values
        # (FedRS head_bias=false) that none has is a typo in them
        known = set(c["algorithm"]) | set(c["qualified"])
        unknown = [a for a in (*above, *below) if a not in known and by and "=" in a]
        if unknown and len(c):
            raise FidelityError(
                f"claim {claim.get('claim')!r}: no cell named {', '.join(map(repr, unknown))} "
                f"(cells: {', '.join(sorted(known))})"
            )
        cc = _pooled(c, claim, {*above, *below}) if claim.get("references") == "pooled" else c
        sources = [FEDRAY, *sorted(set(cc["source"]) - {FEDRAY})] if len(cc) else []
        for source in sources:
            for part, cell in cc[cc["source"] == source].groupby("partition", sort=False):
                values = {a: _claimed(claim, cell, a, part) for a in (*above, *below)}
                if not any(values.get(a) for a in (*above, *below)):
                    continue  # this source runs none of the claim's algorithms here (another paper's method)
                pairs, verdicts = [], []
                for a in above:
                    for b in below:
                        if not values.get(a) or not values.get(b):
                            pairs.append(f"{a} − {b}: not run")
                            verdicts.append("not run")
                            continue
                        s = agreement(values[a], values[b])
                        pairs.append(f"{a} − {b}: {s['diff']:+.1f} (2 SE {2 * s['se']:.1f})")
                        verdicts.append(_pair_verdict(s["diff"], s["se"], a, b))
                lost = [v for v in verdicts if v.startswith("below")]
                verdict = (
                    "not run"
                    if "not run" in verdicts
                    else f"does not hold ({'; '.join(v[7:] for v in lost)})"
                    if lost
                    else "holds"
                    if all(v == "clear" for v in verdicts)
                    else "holds in the means"
                )
                rows.append(
                    {
                        "claim": claim.get("claim", ""),
                        "source": source,
                        "partition": part,
                        "differences (points)": "; ".join(pairs),
                        "verdict": verdict,
                    }
                )
    return pd.DataFrame(rows, columns=["claim", "source", "partition", "differences (points)", "verdict"])


def _claimed(claim: Mapping[str, Any], cell: pd.DataFrame, name: str, part: str) -> list[float]:
    """The per-seed values of the claim's algorithm ``name`` in one source's partition: the cell
    whose qualified name (``FedRS head_bias=false``) it is, else the one cell of that algorithm;
    none: no values."""
    exact = cell[cell["qualified"] == name]
    if len(exact) == 1:
        return list(exact["values"].iloc[0])
    bare = cell[cell["algorithm"] == name]
    if len(bare) > 1:
        raise FidelityError(
            f"claim {claim.get('claim')!r}: {name} has {len(bare)} cells on {part} "
            f"({', '.join(bare['qualified'])}); name one of them"
        )
    return list(bare["values"].iloc[0]) if len(bare) else []


def _pooled(c: pd.DataFrame, claim: Mapping[str, Any], algorithms: set[str]) -> pd.DataFrame:
    """fedray's cells and the references' cells of ``algorithms``, the references' under one source
    named after those that ran them: "the references (A, B)"."""
    c = c[(c["source"] == FEDRAY) | c["algorithm"].isin(algorithms) | c["qualified"].isin(algorithms)]
    refs = sorted(set(c["source"]) - {FEDRAY})
    if not refs:
        return c
    theirs = c[c["source"] != FEDRAY]
    twice = theirs.groupby(["partition", "qualified"])["source"].nunique()
    if (twice > 1).any():
        part, alg = twice[twice > 1].index[0]
        raise FidelityError(
            f"claim {claim.get('claim')!r}: references: pooled, but {alg} on {part} was run by more than one "
            f"reference ({', '.join(sorted(set(theirs[(theirs['partition'] == part) & (theirs['qualified'] == alg)]['source'])))})"
        )
    return c.assign(source=[s if s == FEDRAY else f"the references ({', '.join(refs)})" for s in c["source"]])


def _ordered(c: pd.DataFrame, names: Mapping[str, str] | None, by: list[str]) -> pd.DataFrame:
    """Cells by partition, then algorithm (in the order ``names`` lists them, else by name), then
    the ``by`` fields (numbers as numbers)."""
    if c.empty:
        return c
    order = {n: i for i, n in enumerate(dict.fromkeys((names or {}).values()))}

    def number(v: Any) -> Any:
        try:
            return float(v)
        except (TypeError, ValueError):
            return v

    key = [
        (p, order.get(a, len(order)), a, *(number(v) for v in rest))
        for p, a, *rest in c[["partition", "algorithm", *by]].itertuples(index=False)
    ]
    return c.iloc[sorted(range(len(c)), key=lambda i: key[i])].reset_index(drop=True)


def _pair_verdict(diff: float, se: float, a: str, b: str) -> str:
    if diff > 2 * se:
        return "clear"
    return "mean" if diff > 0 else f"below: {a} not above {b}"


def _names(v: Any) -> list[str]:
    return [str(x) for x in ([v] if isinstance(v, str) else list(v or []))]


def render(
    spec: Mapping[str, Any],
    root: str | Path | None = None,
    out_dir: Path | None = None,
    previous: str | None = None,
) -> str:
    """The page, as markdown. ``out_dir``: where images are written (next to the page). ``previous``:
    the page as it is; a section whose results folder is missing is copied from it (marked), where
    without it that is an error."""
    root = Path(root or spec.get("root", "."))
    parts = [f"# {spec.get('title', 'Fidelity')}", "", str(spec.get("intro", "")).strip(), ""]
    old = _sections(previous) if previous is not None else {}
    for sec in spec.get("sections", []):
        if "title" not in sec or "results" not in sec:
            raise FidelityError("every section needs a title and a results folder")
        folder = Path(sec["results"])
        folder = folder if folder.is_absolute() else root / folder
        if not folder.is_dir():
            if sec["title"] not in old:
                raise FidelityError(
                    f"section {sec['title']!r}: results folder {str(folder)!r} does not exist"
                )
            parts += [f"## {sec['title']}", "", _kept(old[sec["title"]], folder), ""]
            continue
        parts += [f"## {sec['title']}", ""]
        if sec.get("text"):
            parts += [str(sec["text"]).strip(), ""]
        by, names = list(sec.get("by") or []), sec.get("names")
        tuned, tuned_by = list(sec.get("tuned") or []), sec.get("tuned_by")
        c = _ordered(cells(folder, sec.get("read"), by, names, sec.get("where"), tuned, tuned_by), names, by)
        if c.empty:
            parts += ["(no finished runs yet)", ""]
        else:
            table = section_table(c, sec.get("paper"), by)
            parts += [table.to_markdown(index=False, disable_numparse=True), ""]
            parts += [f"Results: `{_shown(folder)}`; read: {_read_text(sec.get('read'))}.", ""]
            if tuned:
                on = f" of {_reading(tuned_by)}" if tuned_by else ""
                parts += [
                    f"Every setting of {', '.join(tuned)}, mean ± std over seeds (each side's cell in bold: "
                    f"of the settings run with the most seeds, the fewest diverged, then the best mean{on}):",
                    "",
                    grid_table(c, by).to_markdown(index=False, disable_numparse=True),
                    "",
                ]
            if sec.get("claims"):
                claims = claim_table(c, list(sec["claims"]), by)
                parts += ["The paper's orderings on these runs:", "", claims.to_markdown(index=False), ""]
        if sec.get("curves") and out_dir is not None:
            image = _curves(folder, out_dir / sec["curves"], sec.get("read"), names, sec.get("where"))
            if image:
                parts += [f"![accuracy curves]({image.name})", ""]
        if sec.get("study"):
            parts += _study(sec["study"])(folder, out_dir, dict(sec.get("study_options") or {}))
        if sec.get("notes"):
            parts += [str(sec["notes"]).strip(), ""]
    return "\n".join(parts).rstrip() + "\n"


KEPT = "_(This section's results folder, `{folder}`, is not on the machine that generated this page; the section is as it was last generated from it.)_"


def _kept(body: str, folder: Path) -> str:
    note = KEPT.format(folder=_shown(folder))
    return body if note in body else f"{note}\n\n{body}"


def _sections(page: str) -> dict[str, str]:
    """The bodies of a generated page's ``## `` sections, by title."""
    out: dict[str, str] = {}
    title = None
    for line in page.splitlines():
        if line.startswith("## "):
            title = line[3:].strip()
            out[title] = ""
        elif title is not None:
            out[title] += line + "\n"
    return {t: body.strip() for t, body in out.items()}


def _shown(folder: Path) -> str:
    """A results folder as the page names it: relative to the working directory when inside it."""
    try:
        return str(folder.resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(folder)


def _study(name: str) -> Any:
    if name == "layercfl":
        from analysis.layer_study import section

        return section
    raise FidelityError(f"unknown study {name!r} (studies: layercfl)")


def _read_text(read: Mapping[str, Any] | None) -> str:
    return f"{_reading(read)}, in percent; mean ± std over seeds (number of seeds)"


def _reading(read: Mapping[str, Any] | None) -> str:
    """What a run is read as: "accuracy at the final round"."""
    read = dict(read or {})
    what = read.get("metric", "accuracy")
    if read.get("round") is not None:
        where = f"round {read['round']}" + (
            f" of stage {read['stage']} (other runs: their final round)" if read.get("stage") else ""
        )
    else:
        at = parse_at(read.get("at", "final"))
        where = {
            "final": "the final round",
            "best-train": "the round of best train_accuracy",
            "best": "the best round",
            "mean_last": f"the mean of the last {at.last} evaluations",
        }[at.how]
    return f"{what} at {where}"


def _curves(
    folder: Path,
    path: Path,
    read: Mapping[str, Any] | None,
    names: Mapping[str, str] | None = None,
    where: Mapping[str, Any] | None = None,
) -> Path | None:
    """Mean accuracy per round, one line per (partition, algorithm, source)."""
    from analysis.load import load_metrics
    from analysis.plots import pyplot, save_figure

    plt = pyplot()
    if plt is None:
        return None

    m = load_metrics(folder, scope="global")
    m = m[m["metric"] == (dict(read or {}).get("metric", "accuracy"))]
    runs = selected(load_runs(folder), where)
    runs = runs[runs["status"] == "finished"]
    labels = {
        r: (field_label(c, "partition"), algorithm_label(c, names), field_label(c, "source"))
        for r, c in zip(runs["run_id"], runs["config"], strict=True)
    }
    m = m[m["run_id"].isin(labels)]
    if m.empty:
        return None
    m = m.assign(key=m["run_id"].map(labels))
    parts = sorted({k[0] for k in labels.values()})
    fig, axes = plt.subplots(1, len(parts), figsize=(5 * len(parts), 3.6), squeeze=False)
    for ax, part in zip(axes[0], parts, strict=True):
        sub = m[m["key"].map(lambda k, p=part: k[0] == p)]
        for key, g in sub.groupby("key", sort=True):
            curve = g.groupby("round")["value"].mean() * 100
            ax.plot(
                curve.index,
                curve.values,
                "--" if key[2] != FEDRAY else "-",
                marker="o",
                markersize=3,
                label=f"{key[1]} ({key[2]})",
            )
        ax.set_title(part)
        ax.set_xlabel("round")
        ax.set_ylabel("accuracy (%)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    return save_figure(fig, path)
