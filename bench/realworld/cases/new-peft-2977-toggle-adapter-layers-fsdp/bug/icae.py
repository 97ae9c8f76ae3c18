"""In-context autoencoder: one Mistral with two LoRA adapters, switched during the forward."""
import torch
from peft import LoraConfig, get_peft_model
from transformers import AutoModelForCausalLM


class ICAE(torch.nn.Module):
    def __init__(self, model_name):
        super().__init__()
        base = AutoModelForCausalLM.from_pretrained(model_name, torch_dtype=torch.bfloat16)
        enc = LoraConfig(r=128, lora_alpha=32, lora_dropout=0.05, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM")
        self.icae = get_peft_model(base, enc, adapter_name="encadapt")
        self.icae.add_adapter("default", LoraConfig(r=128, lora_alpha=32, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM"))
        self.memory_token_embed = torch.nn.Embedding(128, base.config.hidden_size, dtype=torch.bfloat16)

    def forward(self, autoencoder_input_embedding, decoder_input_embeds, labels):
        # encoder pass with the encoder adapter, frozen
        self.icae.set_adapter("encadapt")
        self.icae.enable_adapter_layers()
        for name, param in self.icae.named_parameters():
            if "encadapt" in name:
                param.requires_grad = False
        compress_outputs = self.icae(inputs_embeds=autoencoder_input_embedding, output_hidden_states=True)
        memory = compress_outputs.hidden_states[-1][:, -128:]
        # decoder pass: base model only
        self.icae.disable_adapter_layers()
        dec = torch.cat([memory, decoder_input_embeds], dim=1)
        return self.icae(inputs_embeds=dec, labels=labels)
