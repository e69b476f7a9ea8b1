"""benchmarks: the noise-aware share of the model's top-3 hits (`tied_share`) and its CLI line."""

from workbench.benchmarks import KernelBench, tied_share
from workbench.cli import _model_line
from workbench.profile.compare import compare


def _row(best_rank, tied=()):
    return KernelBench(id="w", policy="roller", construct_seconds=0.0, profile_seconds=0.0,
                       best_seconds=1e-3 if best_rank else None, best_rank=best_rank, spearman=None, baselines=(),
                       comparison=compare((), (), ()), tied=tied)


def test_tied_share_counts_a_top_3_kernel_the_repeats_cannot_tell_from_the_best():
    rows = [_row(5, (2, 5)),  # rank 2 within noise of the best at 5: a tie the top 3 holds
            _row(5, (4, 5)),  # ties outside the top 3: a miss
            _row(1),  # the best at rank 1, no ties recorded: a hit
            _row(7),  # a clear miss
            _row(None)]  # nothing measured: left out
    assert tied_share(rows) == 2 / 4
    assert tied_share(rows, k=4) == 3 / 4
    assert tied_share([_row(None)]) is None


def test_the_model_line_gives_both_counts():
    data = {"model": {"spearman": 0.5},
            "results": [{"best_rank": 5, "within_noise_of_best": [2, 5]}, {"best_rank": 2, "within_noise_of_best": []},
                        {"best_rank": 9, "within_noise_of_best": [9]}, {"best_rank": None, "within_noise_of_best": []}]}
    assert _model_line(data) == ("model: mean Spearman 0.50; measured best in the predicted top 3 for 1 of 3 workloads, "
                                 "2 of 3 counting the kernels within noise of it")
    assert _model_line({"model": {"spearman": None}, "results": []}) == "model: no workload measured"
