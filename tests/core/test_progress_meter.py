"""Cost-weighted progress and its ETA (studio.core.progress, the runner's RunMeter)."""

from __future__ import annotations

from studio.core.calib.runner import Consumer, LinearSite, RunMeter, RunnerMode, RunSpec
from studio.core.jobs import JobContext
from studio.core.progress import WorkMeter


class Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def test_eta_follows_cost_not_step_count():
    clock = Clock()
    m = WorkMeter(110.0, clock)
    assert m.eta() is None and m.line("x") == "x · ETA ?"
    clock.t += 10.0
    m.add(10.0)  # one cheap step of cost 10 took 10 s; a step of cost 100 is left
    assert m.eta() == 100.0 and m.fraction == 10.0 / 110.0
    m.grow(11.0)
    assert m.eta() == 111.0
    m.add(1e9)
    assert m.done == m.total and m.eta() == 0.0 and m.fraction == 1.0


class _Sweeper(Consumer):
    """Work proportional to rows × columns², as a GPTQ sweep."""

    def work(self, site, spec):
        return float(site.out_features * site.in_features**2)


def _spec(sites, meter):
    return RunSpec("m", RunnerMode.LAYERWISE, "cpu", "float32", 2, 8, 1, 4, tuple(sites), False, meter=meter)


def test_run_meter_weighs_sites_and_the_eta_after_the_first_layer_is_right():
    # two layers, each a small and a large matrix; the large one's work takes 16x the small one's
    sites = [
        LinearSite(f"l{i}.{k}", f"l{i}.{k}", i, 8, rows)
        for i in range(2)
        for k, rows in (("a", 1), ("b", 16))
    ]
    seen: list[tuple[int, int, str]] = []
    clock = Clock()
    meter = RunMeter(JobContext(on_progress=lambda d, t, m: seen.append((d, t, m)), min_interval=0.0), clock)
    cons = _Sweeper()
    spec = _spec(sites, meter)
    meter.plan([cons], spec, forward=0.0)
    for s in sites:
        clock.t += 1.0 if s.out_features == 1 else 16.0  # time proportional to the declared cost
        meter.site_done(cons, s, s.name)
        if s.name == "l0.b":
            # after the first layer: 17 s spent, 17 s left, half the bar
            assert meter.meter.eta() == 17.0
            assert seen[-1][0] == 500 and seen[-1][2] == "l0.b · ETA 17 s"
    assert seen[-1][0] == 1000 and meter.meter.eta() == 0.0


def test_settle_counts_work_a_consumer_did_not_report():
    sites = [LinearSite("l0.a", "l0.a", 0, 8, 8), LinearSite("l1.a", "l1.a", 1, 8, 8)]
    meter = RunMeter(JobContext(), Clock())
    meter.plan([_Sweeper()], _spec(sites, meter), forward=512.0 * 2)
    meter.settle(sites[:1])
    assert meter.meter.done == 512.0 and meter.meter.fraction == 0.25


def test_no_eta_before_a_share_of_the_work_is_done():
    """The first steps (the embeddings' lookups, which carry the start-up) give no rate to multiply: the line
    said "ETA 19 h" for a 10-minute export. The ETA shows once ETA_MIN_SHARE of the cost is done."""
    from studio.core.progress import ETA_MIN_SHARE

    clock = Clock()
    m = WorkMeter(1e6, clock)
    clock.t += 5.0
    m.add(ETA_MIN_SHARE * 1e6 / 4)
    assert m.eta() is None and m.line("embeddings: chunk 1/2") == "embeddings: chunk 1/2 · ETA ?"
    m.add(ETA_MIN_SHARE * 1e6)
    assert m.eta() is not None and m.eta() > 0


def test_each_kind_of_work_goes_at_its_own_measured_rate():
    """Work of different kinds runs at different speeds per unit of cost by ratios no cost model knows
    for every machine (issue 40: one rate for all, the 8B fixture's ETA after its first layer was 31 % long
    for the scan, whose one-thread rounding is slower per unit than its matmuls, and 26 % short for GPTQ).
    Each kind keeps its own rate, measured from its second step on: the first carries the start-up."""
    clock = Clock()
    m = WorkMeter(0.0, clock)
    m.plan(10.0 + 2 * 100.0, "forward")  # the embeddings, then a pass through each of two layers
    m.plan(2 * 100.0 + 400.0, "sweep")  # a sweep per layer, then the head's
    clock.t += 5.0
    m.add(10.0, "forward")  # the embeddings, with 5 s of start-up
    clock.t += 1.0
    m.add(100.0, "forward")  # the first layer: its pass, 1 s, and its sweep, 10 s
    clock.t += 10.0
    m.add(100.0, "sweep")
    # left: a pass (1 s) and a sweep (10 s), the head's sweep (40 s); one rate for all said 31.7 s
    assert m.eta() == 51.0
    clock.t += 1.0
    m.add(100.0, "forward")
    assert m.eta() == 50.0


def test_a_kind_not_measured_yet_goes_at_the_jobs_rate():
    clock = Clock()
    m = WorkMeter(0.0, clock)
    m.plan(300.0, "forward")
    m.plan(100.0, "head")
    clock.t += 1.0
    m.add(100.0, "forward")  # start-up: measures nothing
    clock.t += 2.0
    m.add(100.0, "forward")
    # forward at 2 s per 100; the head, not measured, at the job's 3 s per 200
    assert m.eta() == 2.0 + 1.5
