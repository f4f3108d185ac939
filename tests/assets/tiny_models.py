"""Tiny user models for tests: `tests/assets/tiny_models.py:tiny_cnn` style specs."""
import warnings

import torch
import torch.nn as nn


class TinyCNN(nn.Module):
    input_size = (3, 16, 16)

    def __init__(self, num_classes: int = 10):
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.bn = nn.BatchNorm2d(8)
        self.fc = nn.Linear(8, num_classes)

    def forward(self, x):                       # (N, 3, H, W)
        x = torch.relu(self.bn(self.conv(x)))   # (N, 8, H, W)
        return self.fc(x.mean((2, 3)))          # (N, classes)


class GraphBreakCNN(TinyCNN):
    def forward(self, x):
        x = torch.relu(self.bn(self.conv(x)))
        torch._dynamo.graph_break()             # deliberate: compile must report it
        return self.fc(x.mean((2, 3)))


class WarningCNN(TinyCNN):
    def forward(self, x):
        warnings.warn("tiny model warns every call", UserWarning)
        return super().forward(x)


def tiny_cnn(num_classes: int = 10):
    return TinyCNN(num_classes)


def graph_break_cnn():
    return GraphBreakCNN()


def warning_cnn():
    return WarningCNN()


def raising_factory():
    raise RuntimeError("factory exploded on purpose")


def not_a_module():
    return 42


class SpawningCNN(TinyCNN):
    """A model whose first forward starts helper processes the way real code does by accident:
    one in its own process group, one in a new session (`setsid`), and one double-forked
    orphan. Their pids go to $FUSEBENCH_TEST_PIDS so a test can check they died with the cell."""
    spawned = False

    def forward(self, x):
        if not SpawningCNN.spawned:
            SpawningCNN.spawned = True
            import os
            import subprocess
            import sys
            pids = [subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"]).pid,
                    subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"],
                                     start_new_session=True).pid]
            # a grandchild whose parent exits at once: re-parented away from the worker
            orphan = subprocess.run(
                [sys.executable, "-c", "import subprocess, sys; print(subprocess.Popen(["
                 "sys.executable, '-c', 'import time; time.sleep(600)'], "
                 "start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL).pid)"],
                capture_output=True,
                text=True)
            pids.append(int(orphan.stdout))
            with open(os.environ["FUSEBENCH_TEST_PIDS"], "a") as f:
                f.write("".join(f"{p}\n" for p in pids))
            if os.environ.get("FUSEBENCH_TEST_HANG"):
                import time
                time.sleep(3600)      # a hung step: the runner kills the worker at --timeout
        return super().forward(x)


def spawning_cnn():
    return SpawningCNN()
