"""Source text of the plug-in remedies the tests write to files (a plug-in is loaded from a file, by path)."""

HEADER = '''
import torch
from timbench.remedies import Remedy, finish, log_rho
'''

HALVE = '''
class Halve(Remedy):
    name = "halve"
    doc = "weights 0.5"
    def __call__(self, batch):
        return finish(batch, weights=torch.full_like(log_rho(batch), 0.5), extra={"halve/scale": 0.5})
'''
"""Every token's weight 0.5, and a metric of its own (`halve/scale`)."""
