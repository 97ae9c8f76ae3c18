import pytorch_lightning as pl
import pytorch_lightning.strategies as strategies
import torch
import torch.utils.data
from transformers import AutoModelForCausalLM, AutoTokenizer
from transformers.models.mixtral.modeling_mixtral import MixtralDecoderLayer

MODEL = "mistralai/Mixtral-8x7B-v0.1"


class TextDataset(torch.utils.data.Dataset):
    def __init__(self, tokenizer):
        self.data = [
            "Transformers is a media franchise produced by American toy company Hasbro",
            "and Japanese toy company Takara Tomy.",
        ]
        self.tokenizer = tokenizer

    def __len__(self):
        return len(self.data)

    def __getitem__(self, i):
        enc = self.tokenizer(self.data[i], padding="max_length", max_length=64, return_tensors="pt")
        return {k: v[0] for k, v in enc.items()}


class Model(pl.LightningModule):
    def __init__(self):
        super().__init__()
        self.model = None

    def configure_model(self):
        if self.model is None:
            self.model = AutoModelForCausalLM.from_pretrained(MODEL, torch_dtype=torch.bfloat16)

    def training_step(self, batch, batch_idx):
        out = self.model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], labels=batch["input_ids"])
        return out.loss

    def configure_optimizers(self):
        return torch.optim.AdamW(self.trainer.model.parameters(), lr=1e-5)


if __name__ == "__main__":
    tokenizer = AutoTokenizer.from_pretrained(MODEL)
    tokenizer.pad_token = tokenizer.eos_token
    loader = torch.utils.data.DataLoader(TextDataset(tokenizer), batch_size=1)
    strategy = strategies.FSDPStrategy(
        auto_wrap_policy={MixtralDecoderLayer},
        activation_checkpointing_policy={MixtralDecoderLayer},
        sharding_strategy="FULL_SHARD",
    )
    trainer = pl.Trainer(accelerator="gpu", devices=8, strategy=strategy, precision="bf16-true", max_steps=10)
    trainer.fit(Model(), loader)
