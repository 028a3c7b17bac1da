"""Communication on top of torch.distributed."""
