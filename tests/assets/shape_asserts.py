"""A block that checks its input's shape with a plain `assert`, as Swin's blocks (`assert L ==
H * W, "input feature has wrong size"`) and much research code do. Kept out of the test
modules: pytest rewrites the asserts there into other bytecode."""
import torch.nn as nn
import torch.nn.functional as F


class Asserts(nn.Module):
    def __init__(self):
        super().__init__()
        self.resolution = (2, 3)
        self.fc1, self.fc2 = nn.Linear(8, 32), nn.Linear(32, 8)

    def forward(self, x):
        b, length, c = x.shape
        h, w = self.resolution
        assert length == h * w, "input feature has wrong size"
        return x + self.fc2(F.gelu(self.fc1(x)))
