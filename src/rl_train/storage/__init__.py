"""Storage: the TransferQueue between the boxes, datasets, replay buffers and checkpoints."""
