import lightning as L
import torch
from transformers import AutoModelForSequenceClassification

fabric = L.Fabric(accelerator="cuda", precision="16-mixed", strategy="fsdp")
fabric.launch()
torch.set_float32_matmul_precision("medium")

model = AutoModelForSequenceClassification.from_pretrained("distilbert-base-uncased", num_labels=2)
optimizer = torch.optim.Adam(model.parameters(), lr=5e-5)

model = fabric.setup_module(model)
optimizer = fabric.setup_optimizers(optimizer)

model.train()
for step in range(10):
    batch = {"input_ids": torch.randint(0, 1000, (8, 64), device=fabric.device),
             "labels": torch.randint(0, 2, (8,), device=fabric.device)}
    loss = model(**batch).loss
    fabric.backward(loss)
    optimizer.step()
    optimizer.zero_grad()
