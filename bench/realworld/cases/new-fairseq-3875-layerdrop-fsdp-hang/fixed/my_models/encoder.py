import numpy as np
import torch.nn as nn
from fairseq.distributed import fsdp_wrap
from fairseq.models import BaseFairseqModel, register_model, register_model_architecture
from fairseq.modules import TransformerSentenceEncoderLayer


class LayerDropEncoder(nn.Module):
    def __init__(self, args):
        super().__init__()
        self.layerdrop = args.encoder_layerdrop
        # every layer is its own FSDP unit
        self.layers = nn.ModuleList(
            [fsdp_wrap(TransformerSentenceEncoderLayer(embedding_dim=args.encoder_embed_dim)) for _ in range(args.encoder_layers)]
        )

    def forward(self, x, padding_mask=None):
        for layer in self.layers:
            dropout_probability = np.random.random()
            keep = not self.training or (dropout_probability > self.layerdrop)
            # run every layer on every rank so each FSDP unit all-gathers; drop only its output
            layer_out, _ = layer(x, self_attn_padding_mask=padding_mask, need_weights=False)
            if keep:
                x = layer_out
        return x


@register_model("my_encoder")
class MyEncoderModel(BaseFairseqModel):
    def __init__(self, args):
        super().__init__()
        self.encoder = LayerDropEncoder(args)

    @classmethod
    def build_model(cls, args, task):
        return cls(args)

    def forward(self, source, padding_mask=None):
        return self.encoder(source, padding_mask)


@register_model_architecture("my_encoder", "my_encoder")
def base_architecture(args):
    args.encoder_layers = getattr(args, "encoder_layers", 12)
    args.encoder_embed_dim = getattr(args, "encoder_embed_dim", 768)
    args.encoder_layerdrop = getattr(args, "encoder_layerdrop", 0.0)
