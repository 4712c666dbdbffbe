"""`eval_windows`: the final held-out loss reads that many windows (a slow node's run ends sooner)."""

from __future__ import annotations

import pytest
import torch

from fatpipe.infra.trainspec import TrainSpec
from fatpipe.trainer.config import ConfigError, parse_config
from fatpipe.trainer.data import Windows, open_splits
from fatpipe.trainer.heldout import heldout_loss


class MeanModel(torch.nn.Module):
    """Loss = the window's first token, so the mean says exactly which windows were read."""

    def forward(self, x, y):
        return None, x[:, 0].float().mean()


def test_the_loss_reads_the_first_count_windows(tmp_path):
    (tmp_path / "text.txt").write_bytes(bytes(range(64)))
    windows = Windows(open_splits(str(tmp_path / "text.txt"))[0], 3)
    loss, read = heldout_loss(MeanModel(), windows, range(2, 10), 2, torch.device("cpu"), 3)
    assert read == 3 and loss == pytest.approx(sum(windows.window(w)[0].item() for w in (2, 3, 4)) / 3)


def test_the_flag_and_the_train_key():
    assert parse_config(["--eval-windows", "8"]).eval_windows == 8
    assert parse_config([]).eval_windows == 128
    with pytest.raises(ConfigError, match="--eval-windows must be >= 1"):
        parse_config(["--eval-windows", "0"])
    assert "--eval-windows" in TrainSpec(eval_windows=8).trainer_args()
