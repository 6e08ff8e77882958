"""Hydra overrides that shrink the default fit to a run of a few seconds on a laptop CPU,
shared by the CLI and sweep tests."""

TINY_RUN = [
    "model.embedding_dim=8",
    "model.hidden_size=16",
    "model.num_layers=1",
    "data.batch_size=4",
    "data.seq_len=16",
    "trainer.accelerator=cpu",
    "trainer.max_epochs=1",
    "trainer.limit_train_batches=3",
    "trainer.limit_val_batches=2",
    "trainer.limit_test_batches=2",
    "~callbacks.rich_progress_bar",
]
