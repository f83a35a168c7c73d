"""Operations on sandboxes and checkpoints: the Manager, the lease protocol every operation
follows, checkpoints, idempotent creates, the backends' capabilities."""
