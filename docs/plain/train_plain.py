"""A plain transformers training loop, the way a user writes it, for the suite's overhead check.

Same model and settings as pytest-mig's test_training: the model built from its configuration
(random weights, SDPA attention; ``--attn causal_sdpa``, the default, registers SDPA with no mask
tensor as the suite does, ``--attn sdpa`` is transformers' own), full fine-tune with fp32 weights under bf16 autocast and fused
AdamW, or LoRA (peft, rank 16, alpha 32, every attention and MLP projection) on a bf16 base, or
QLoRA (bitsandbytes NF4, prepare_model_for_kbit_training, then LoRA).  Prints one JSON line.

    python docs/plain/train_plain.py --model qwen1.5b --mode lora --batch 2 --steps 20
"""

import argparse
import json
import tempfile
import time

import torch
from transformers import AutoModelForCausalLM, BitsAndBytesConfig, GPT2Config, Qwen2Config

parser = argparse.ArgumentParser()
parser.add_argument("--model", default="qwen1.5b", choices=["qwen1.5b", "gpt2-small"])
parser.add_argument("--mode", default="lora", choices=["full", "lora", "qlora"])
parser.add_argument("--batch", type=int, default=2)
parser.add_argument("--steps", type=int, default=20)
parser.add_argument("--compile", action="store_true")
parser.add_argument("--attn", default="causal_sdpa", choices=["causal_sdpa", "sdpa"])
args = parser.parse_args()

if args.attn == "causal_sdpa":
    # Every sequence here is whole, so causality is SDPA's is_causal: no 4-D mask tensor, which
    # transformers' "sdpa" builds under torch.compile with torch < 2.14.
    from transformers import AttentionInterface, AttentionMaskInterface
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    AttentionInterface.register("causal_sdpa", sdpa_attention_forward)
    AttentionMaskInterface.register("causal_sdpa", lambda *a, **k: None)

if args.model == "qwen1.5b":
    config = Qwen2Config(vocab_size=151936, hidden_size=1536, intermediate_size=8960, num_hidden_layers=28,
                         num_attention_heads=12, num_key_value_heads=2, max_position_embeddings=32768,
                         rope_theta=1e6, rms_norm_eps=1e-6, tie_word_embeddings=True, use_cache=False)
    seq, targets = 512, ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
else:
    config = GPT2Config(vocab_size=50304, n_positions=1024, n_embd=768, n_layer=12, n_head=12, resid_pdrop=0.0,
                        embd_pdrop=0.0, attn_pdrop=0.0, use_cache=False)
    seq, targets = 1024, ["c_attn", "c_proj", "c_fc"]

if args.mode == "qlora":
    from peft import LoraConfig, get_peft_model, prepare_model_for_kbit_training

    with tempfile.TemporaryDirectory() as tmp:
        with torch.device("cuda"):
            AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16).save_pretrained(tmp)
        torch.cuda.empty_cache()
        bnb = BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_compute_dtype=torch.bfloat16)
        model = AutoModelForCausalLM.from_pretrained(tmp, quantization_config=bnb, dtype=torch.bfloat16,
                                                     attn_implementation=args.attn, device_map={"": 0})
    model = prepare_model_for_kbit_training(model, gradient_checkpointing_kwargs={"use_reentrant": False})
    model = get_peft_model(model, LoraConfig(r=16, lora_alpha=32, lora_dropout=0.0, target_modules=targets,
                                             task_type="CAUSAL_LM"))
else:
    with torch.device("cuda"):
        dtype = torch.bfloat16 if args.mode == "lora" else torch.float32
        model = AutoModelForCausalLM.from_config(config, dtype=dtype, attn_implementation=args.attn)
    if args.mode == "lora":
        from peft import LoraConfig, get_peft_model

        model = get_peft_model(model, LoraConfig(r=16, lora_alpha=32, lora_dropout=0.0, target_modules=targets,
                                                 fan_in_fan_out=args.model == "gpt2-small", task_type="CAUSAL_LM"))
model.train()
optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-4, fused=True)
forward = torch.compile(model) if args.compile else model
batches = [torch.randint(0, config.vocab_size, (args.batch, seq), device="cuda") for _ in range(4)]


def step(tokens):
    optimizer.zero_grad(set_to_none=True)
    with torch.autocast("cuda", dtype=torch.bfloat16):
        loss = forward(input_ids=tokens, labels=tokens).loss
    loss.backward()
    optimizer.step()


for i in range(5):  # warm-up (and compilation)
    step(batches[i % 4])
torch.cuda.synchronize()
events = []
start = time.perf_counter()
for i in range(args.steps):
    begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    begin.record()
    step(batches[i % 4])
    end.record()
    events.append((begin, end))
torch.cuda.synchronize()
elapsed = time.perf_counter() - start
per_step = sorted(b.elapsed_time(e) / 1e3 for b, e in events)
tokens = args.batch * seq
print(json.dumps({"model": args.model, "mode": args.mode, "batch": args.batch, "compiled": args.compile,
                  "attn": args.attn, "tokens_per_s": args.steps * tokens / elapsed,  # wall clock over all steps
                  "tokens_per_s_median_step": tokens / per_step[len(per_step) // 2],  # CUDA events, as the suite's samples
                  "steps": args.steps, "peak_allocated_gb": torch.cuda.max_memory_allocated() / 1e9}))
