import os, sys, traceback
import torch, torch.distributed as dist, torch.multiprocessing as mp

TP = int(os.environ.get("TP", "2"))
CKPT = os.environ.get("CKPT", "/tmp/mcore_ckpt")

def worker(rank, world):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT="29533", USE_LIBUV="0")
    dist.init_process_group("gloo", rank=rank, world_size=world)
    if os.environ.get("PATCH_SYNC") == "1" and not torch.cuda.is_available():
        torch.cuda.synchronize = lambda *a, **k: None  # probe-only workaround
    if os.environ.get("PATCH_DEV") == "1" and not torch.cuda.is_available():
        torch.cuda.current_device = lambda: "cpu"  # probe-only workaround
    try:
        from megatron.core import parallel_state, dist_checkpointing
        from megatron.core.transformer.transformer_config import TransformerConfig
        from megatron.core.models.gpt import GPTModel
        from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
        from megatron.core.tensor_parallel import model_parallel_cuda_manual_seed
        parallel_state.initialize_model_parallel(tensor_model_parallel_size=TP)
        print(f"[{rank}] mp init ok TP={TP}", flush=True)
        try:
            model_parallel_cuda_manual_seed(123)
        except Exception as e:
            print(f"[{rank}] model_parallel_cuda_manual_seed failed: {type(e).__name__}: {e}", flush=True)
        cfg = TransformerConfig(num_layers=2, hidden_size=64, num_attention_heads=4,
                                use_cpu_initialization=True, pipeline_dtype=torch.float32)
        model = GPTModel(config=cfg, transformer_layer_spec=get_gpt_layer_local_spec(),
                         vocab_size=128, max_sequence_length=32)
        print(f"[{rank}] model built, params={sum(p.numel() for p in model.parameters())}", flush=True)
        sd = model.sharded_state_dict()
        print(f"[{rank}] sharded_state_dict keys={len(sd)}", flush=True)
        dist_checkpointing.save(sd, CKPT)
        print(f"[{rank}] SAVE OK", flush=True)
    except Exception:
        traceback.print_exc()
        sys.stdout.flush(); sys.stderr.flush()
        raise
    finally:
        dist.destroy_process_group()

if __name__ == "__main__":
    os.makedirs(CKPT, exist_ok=True)
    mp.spawn(worker, args=(2,), nprocs=2)
