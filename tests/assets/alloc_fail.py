"""A tiny user model whose forward fails to allocate for batches above 2, with the message a
CPU (or CUDA) allocator gives: exercises the OOM status and the smaller-batch retry."""
import torch
import torch.nn as nn

CPU_ALLOC = ("[enforce fail at alloc_cpu.cpp:117] data. DefaultCPUAllocator: can't allocate "
             "memory: you tried to allocate 1099511627776 bytes. Error code 12 (Cannot "
             "allocate memory)")


class AllocFailCNN(nn.Module):
    input_size = (3, 16, 16)

    def __init__(self, message: str):
        super().__init__()
        self.message = message
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.fc = nn.Linear(8, 10)

    def forward(self, x):                       # (N, 3, H, W)
        if x.shape[0] > 2:                      # what a too-big batch does to the allocator
            raise RuntimeError(self.message)
        return self.fc(torch.relu(self.conv(x)).mean((2, 3)))   # (N, 10)


def alloc_fail_cnn(message: str = CPU_ALLOC) -> nn.Module:
    return AllocFailCNN(message)
