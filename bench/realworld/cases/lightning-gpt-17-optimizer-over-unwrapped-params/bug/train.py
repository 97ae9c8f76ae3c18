import lightning as L
import torch
import torch.nn.functional as F

from gpt import GPT


class GPTModule(L.LightningModule):
    def __init__(self, learning_rate=3e-4, weight_decay=0.1, betas=(0.9, 0.95)):
        super().__init__()
        self.save_hyperparameters()
        self.gpt = GPT()

    def training_step(self, batch, batch_idx):
        idx, targets = batch
        logits = self.gpt(idx)
        return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))

    def configure_optimizers(self):
        return self.gpt.configure_optimizers(
            learning_rate=self.hparams.learning_rate,
            weight_decay=self.hparams.weight_decay,
            betas=self.hparams.betas,
        )


if __name__ == "__main__":
    data = torch.utils.data.TensorDataset(torch.randint(0, 50257, (256, 128)), torch.randint(0, 50257, (256, 128)))
    trainer = L.Trainer(accelerator="gpu", devices=4, strategy="fsdp_native", precision=16, max_epochs=1)
    trainer.fit(GPTModule(), torch.utils.data.DataLoader(data, batch_size=8))
