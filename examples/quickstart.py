"""The quickstart from the docs: operators on the configured device, placement, explain.

    python examples/quickstart.py
"""

import numpy as np

import opruntime as opr

print(opr.devices())  # the devices present here, best first; the first is the default

x = opr.tensor(np.random.rand(64, 128).astype(np.float32))  # on the configured device
w = np.random.rand(128, 10).astype(np.float32)  # host data joins x's device
p = opr.softmax(opr.matmul(x, w), axis=-1)  # a Tensor on the same device
print(p.shape, p.dtype, p.device, p.numpy().sum(axis=1)[:3])  # .numpy() copies to the host

with opr.device("cpu"):  # host data in this block goes to the CPU (this thread only)
    y = opr.conv2d(np.ones((1, 3, 8, 8), np.float32), np.ones((4, 3, 3, 3), np.float32), padding="same")
print(y.shape, y.device)

print(opr.explain("matmul", x, w))  # the candidates, the choice and why
assert np.allclose(p.numpy().sum(axis=1), 1.0, atol=1e-5)
