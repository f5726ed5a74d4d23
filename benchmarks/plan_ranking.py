"""How `smplan plan` ranks interleaved plans: the closed form, the ILP's objective, the simulation.

    python benchmarks/plan_ranking.py
1. A faster network never picks a slower plan: `smplan plan` (the CLI, as a user runs it) for the
   bundled llama3_8b on two 4-GPU L40S nodes (l40sx8 with --hw-set gpus_per_node=4) at 8-100 GB/s
   between nodes; the step times must not rise (search.ALTERNATE_SHARE, a review's case).
2. Closed form vs simulation for the search's best plans and runner-ups of that case at 50 GB/s,
   through the functions `plan` calls (planner.search.plan_model, simulator.rank.simulated).
3. The interleaved ILP's objective vs the closed form of the plan it becomes, over the
   interleaved candidates whose bound is within 5% of the best: where it exceeds the closed form
   a cutoff on it would drop plans, so the cutoff is 10% looser (solve.SPREAD_MARGIN).
4. `smplan plan ... --json` end to end for four models: pick, simulated step, wall time.
5. The polish (solve.polish) of the search's best pipeline plan for the models of part 4: its
   closed form as the ILP's partition left it, and polished.
6. The textbook pipeline formulas (AMP's critical path for 1F1B and GPipe, the interleaved bubble)
   against the replay (closed_form.compute_end_s) over 6,000 random splits of equal blocks with
   an embedding and a head: where the replay comes in under them they are no floor for the
   search's bounds (bounds.textbook_is_floor).
"""

from __future__ import annotations

import json
import random
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from smplan.hwprofiles import load_cluster  # noqa: E402
from smplan.planner import profile_model  # noqa: E402
from smplan.planner.bounds import lower_bound  # noqa: E402
from smplan.planner.closed_form import pipeline_time_s  # noqa: E402
from smplan.planner.cost_model import CostModel  # noqa: E402
from smplan.planner.costs import PlanCosts, StageCosts  # noqa: E402
from smplan.planner.ilp import partition_for  # noqa: E402
from smplan.planner.memory_model import capacity_bytes  # noqa: E402
from smplan.planner.search import plan_model, search  # noqa: E402
from smplan.planner.search_space import enumerate_candidates, validate_constraints  # noqa: E402
from smplan.planner.solve import plan_of, polished, solve  # noqa: E402
from smplan.simulator.rank import simulated  # noqa: E402

SMPLAN = str(Path(sys.executable).parent / "smplan")
L40S = ["examples/gpt.py:llama3_8b", "--hw", "l40sx8", "--hw-set", "gpus_per_node=4", "--nodes", "2",
        "--global-batch", "32", "--seq-len", "4096"]
BANDWIDTHS_GBPS = (8, 16, 25, 32, 40, 50, 64, 100)
CLI_CASES = [
    ["examples/gpt.py:gpt3_175b", "--hw", "a100x8", "--nodes", "128", "--global-batch", "1536"],
    ["examples/gpt.py:gpt3_1t", "--hw", "a100x8", "--nodes", "384", "--global-batch", "3072"],
    ["examples/moe.py:deepseek_v3", "--hw", "h100x8", "--nodes", "128", "--global-batch", "8192", "--seq-len", "4096"],
    ["examples/gpt.py:llama3_8b", "--hw", "h100x8", "--nodes", "4", "--global-batch", "64", "--seq-len", "8192"],
]
ILP_CASES = [("gpt3_175b", 128, 1536), ("gpt3_1t", 384, 3072)]  # a100x8 nodes, global batch


def plan_cli(args: list[str]) -> tuple[dict, float]:
    t0 = time.perf_counter()
    out = subprocess.run([SMPLAN, "plan", *args, "--json"], cwd=ROOT, capture_output=True, text=True)
    if out.returncode:
        raise SystemExit(f"smplan plan {' '.join(args)} failed: {out.stderr.strip()}")
    return json.loads(out.stdout), time.perf_counter() - t0


def shape(p: dict) -> str:
    sched = p["schedule"] + (f" v={p['virtual_stages']}" if p["virtual_stages"] > 1 else "")
    return f"dp={p['dp']} tp={p['tp']} pp={p['pp']} ep={p['ep']} mbs={p['micro_batch']} {sched}"


def bandwidth_sweep() -> None:
    print("1. llama3_8b on 2x4 L40S: the pick at each inter-node bandwidth (smplan plan)")
    times = []
    for gbps in BANDWIDTHS_GBPS:
        record, _ = plan_cli([*L40S, "--hw-set", f"inter_node.bandwidth_gbps={gbps}"])
        best = record["plans"][0]
        times.append(best["step_time_s"])
        print(f"   {gbps:4d} GB/s  {shape(best):40s} {best['step_time_s']:.3f} s  "
              f"({record['search']['runner_ups_simulated']} runner-ups simulated)")
    rises = [b for a, b in zip(BANDWIDTHS_GBPS, BANDWIDTHS_GBPS[1:], strict=False)
             if times[BANDWIDTHS_GBPS.index(b)] > times[BANDWIDTHS_GBPS.index(a)] * (1 + 1e-9)]
    print(f"   step time never rises with bandwidth: {'met' if not rises else 'NOT met at ' + str(rises)}")


def closed_form_vs_simulation() -> None:
    print("2. the same at 50 GB/s: closed form vs simulated step of the search's plans and runner-ups")
    cluster = load_cluster("l40sx8", nodes=2, overrides={"gpus_per_node": 4, "inter_node.bandwidth_gbps": 50})
    result = plan_model("examples/gpt.py:llama3_8b", cluster, seq_len=4096, global_batch=32, top=10, alternates=True)
    for tag, plans in (("best", result.plans), ("runner-up", result.alternates)):
        for p in plans:
            closed, sim = p.predicted.step_time_s, simulated(p, cluster).predicted.step_time_s
            blocks = "/".join(str(st.num_blocks) for st in p.stages)
            print(f"   {tag:9s} {p.degrees:22s} v={p.virtual_stages} blocks {blocks:44s} closed {closed:.3f} s  "
                  f"simulated {sim:.3f} s  closed/simulated {100 * (closed / sim - 1):+.1f}%")


def ilp_objective_vs_closed_form() -> None:
    print("3. interleaved ILP objective vs its plan's closed form (candidates with a bound within 5% of the best)")
    for preset, nodes, gbs in ILP_CASES:
        profile = profile_model(f"{ROOT}/examples/gpt.py:{preset}")
        cluster = load_cluster("a100x8", nodes=nodes)
        best = search(profile, cluster, global_batch=gbs, top=1).plans[0].predicted.step_time_s
        fixed = validate_constraints(profile, cluster, None, gbs, None, None, None)
        cm, cap, gaps = CostModel(profile, cluster), capacity_bytes(cluster), []
        for cand in enumerate_candidates(profile, cluster, fixed, None, None):
            if cand.schedule != "interleaved" or cand.v < 2:
                continue
            bound, why, _ = lower_bound(cm, cand, cap)
            if why or bound > best * 1.05:
                continue
            part = partition_for(cm, cand, cap)
            if part is not None:
                plan = plan_of(cm, cand, part.blocks, part.recompute, gbs, preset)
                gaps.append(part.objective / plan.predicted.step_time_s - 1)
        print(f"   {preset:10s} {nodes * 8:5d} GPUs: {len(gaps)} partitions, objective over closed form "
              f"{100 * min(gaps):+.1f}% .. {100 * max(gaps):+.1f}%  (solve.SPREAD_MARGIN 10%)")


def cli_times() -> None:
    print("4. smplan plan --json end to end (profile cached after the first run of each)")
    for args in CLI_CASES:
        plan_cli(args)  # profile (cached) and warm
        record, wall = plan_cli(args)
        best = record["plans"][0]
        print(f"   {args[0]:28s} {shape(best):44s} {best['step_time_s']:8.3f} s/step  "
              f"{record['search']['runner_ups_simulated']:2d} runner-ups  {wall:5.2f} s wall")


POLISH_CASES = [("gpt.py:gpt3_175b", "a100x8", 128, 1536, None, {}), ("gpt.py:gpt3_1t", "a100x8", 384, 3072, None, {}),
                ("moe.py:deepseek_v3", "h100x8", 128, 8192, 4096, {}),
                ("gpt.py:llama3_8b", "l40sx8", 2, 32, 4096, {"gpus_per_node": 4, "inter_node.bandwidth_gbps": 50})]


def polish_gains() -> None:
    print("5. the search's best plan with pp > 1: closed form of the ILP's partition, and polished")
    for ref, hw, nodes, gbs, seq, overrides in POLISH_CASES:
        profile = profile_model(f"{ROOT}/examples/{ref}", {}, seq_len=seq)
        cluster = load_cluster(hw, nodes=nodes, overrides=overrides)
        best = next((p for p in search(profile, cluster, global_batch=gbs, top=10).plans if p.pp > 1), None)
        if best is None:
            print(f"   {ref:22s} no plan with pp > 1 among the best 10")
            continue
        fixed = validate_constraints(profile, cluster, None, gbs, None, None, best.dtype)
        cm, cap = CostModel(profile, cluster), capacity_bytes(cluster)
        same = ("tp", "pp", "dp", "ep", "cp", "schedule", "zero", "dtype")
        for cand in enumerate_candidates(profile, cluster, fixed, None, None):
            if any(getattr(cand, k) != getattr(best, k) for k in same) or (cand.mbs, cand.v, cand.kind) != \
                    (best.micro_batch, best.virtual_stages, best.stages[0].recompute):
                continue
            ilp = solve(cm, cand, cap, gbs, ref)
            polished_plan = polished(cm, cand, cap, gbs, ref)
            if polished_plan is not None and polished_plan.replace(model=best.model) == best:
                t0, t1 = ilp.predicted.step_time_s, polished_plan.predicted.step_time_s
                print(f"   {ref:22s} {best.degrees:22s} v={best.virtual_stages}  ILP {t0:.3f} s  polished {t1:.3f} s "
                      f"({100 * (t1 / t0 - 1):+.2f}%)")
                break


def textbook_vs_replay(trials: int = 6000) -> None:
    print(f"6. textbook formula over the replay, {trials:,} random splits of equal blocks (embedding, head, sends)")
    rng, gaps = random.Random(11), {}
    for _ in range(trials):
        schedule = rng.choice(["1f1b", "gpipe", "interleaved"])
        p = rng.choice([2, 3, 4, 8])
        v = rng.choice([2, 3, 4]) if schedule == "interleaved" else 1
        m = p * rng.choice([1, 2, 3, 4, 6, 8]) if v > 1 else rng.choice([1, 2, 3, p, p + 1, 2 * p, 4 * p, 6 * p])
        chunks = p * v
        cuts = sorted(rng.sample(range(1, rng.randint(chunks, 6 * chunks)), chunks - 1)) if chunks > 1 else []
        blocks = [b - a for a, b in zip([0, *cuts], [*cuts, (cuts[-1] if cuts else 0) + rng.randint(1, 6)],
                                        strict=True)]
        ratio, pre, post, send = rng.uniform(1.8, 3.2), rng.uniform(0, 1), rng.uniform(0, 3), rng.choice([0.0, 0.05])
        stages = tuple(StageCosts(forward_s=n + (pre if c == 0 else 0) / 3 + (post if c == chunks - 1 else 0) / 3,
                                  backward_s=n * ratio + (pre if c == 0 else 0) * 2 / 3 + (post if c == chunks - 1 else 0) * 2 / 3,
                                  send_s=send if c < chunks - 1 else 0.0) for c, n in enumerate(blocks))
        costs = PlanCosts(stages=stages, num_microbatches=m, pp=p, virtual_stages=v, schedule=schedule)
        work = sum(s.forward_s + s.backward_s for s in stages)
        sends = [s.send_s for s in stages]
        cycle = (work + 2 * sum(sends)) / p  # the mean device's passes per micro-batch
        if v > 1:
            formula, kind = m * cycle + (p - 1) / v * work / p + 2 * sum(sends[: p - 1]), "interleaved"
        else:
            formula = work + 2 * sum(sends) + (m - 1) * cycle
            kind = "gpipe" if schedule == "gpipe" else f"1f1b m {'>' if m > p else '<='} pp"
        gaps.setdefault(kind, []).append(formula / pipeline_time_s(costs) - 1)
    for kind, g in sorted(gaps.items()):
        print(f"   {kind:14s} {len(g):5,d} splits: textbook at the mean over the replay {100 * min(g):+.1f}% .. "
              f"{100 * max(g):+.2f}%  (over 0: no floor)")


def main() -> None:
    bandwidth_sweep()
    closed_form_vs_simulation()
    ilp_objective_vs_closed_form()
    cli_times()
    polish_gains()
    textbook_vs_replay()


if __name__ == "__main__":
    main()
