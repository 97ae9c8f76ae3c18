from transformers import Trainer


class TabulaTrainer(Trainer):
    """Trainer that keeps the unused columns the Tabula data collator needs."""

    def _remove_unused_columns(self, dataset, description=None):
        return dataset
