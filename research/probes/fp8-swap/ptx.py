"""sm_90 PTX counts of swap_kernel's variants (no GPU needed)."""
import re, sys, pathlib
sys.path.insert(0, str(pathlib.Path(__file__).parent))
import triton
from triton.compiler import ASTSource
from triton.backends.compiler import GPUTarget
from swap_kernel import swapped_kernel

def ptx(**cfg):
  num_warps = cfg.pop("num_warps"); num_stages = cfg.pop("num_stages")
  sig = {"a_ptr": "*fp8e4nv", "b_ptr": "*fp8e4nv", "c_ptr": "*bf16", "scale_ptr": "*fp32"}
  consts = dict(M=128, N=14336, K=4096, **cfg)
  for k in consts: sig[k] = "constexpr"
  src = ASTSource(swapped_kernel, sig, constexprs={(i,): v for i, v in enumerate([None]*4 + list(consts.values()))} if False else {k: v for k, v in consts.items()},
                  attrs={(i,): [["tt.divisibility", 16]] for i in range(4)})
  k = triton.compile(src, target=GPUTarget("cuda", 90, 64),
                     options=dict(num_warps=num_warps, num_stages=num_stages))
  return k.asm["ptx"], k.asm["ttgir"]

base = dict(BLOCK_N=128, BLOCK_M=128, BLOCK_K=128, PROMOTE=True, TRANS_LOAD=False, num_warps=8, num_stages=3, REG_A=0)
for cfg in [dict(base, REG_A=1), dict(base, REG_A=2), dict(base, REG_A=2, num_warps=4, BLOCK_N=64),dict(BLOCK_N=128, BLOCK_M=128, BLOCK_K=128, PROMOTE=True, TRANS_LOAD=False, num_warps=8, num_stages=3),
            dict(BLOCK_N=128, BLOCK_M=128, BLOCK_K=128, PROMOTE=True, TRANS_LOAD=True, num_warps=8, num_stages=3),
            dict(BLOCK_N=64, BLOCK_M=128, BLOCK_K=128, PROMOTE=True, TRANS_LOAD=False, num_warps=4, num_stages=4)]:
  p, g = ptx(**dict(cfg))
  wg = re.findall(r"wgmma\.mma_async[^ ]*", p)
  print(cfg)
  print("  wgmma:", sorted(set(wg)), len(wg))
  print("  wgmma A from regs:", len(re.findall(r"wgmma\.mma_async[^\n]*\}, \{", p)))
  for op in ["cp.async.cg", "cp.async.ca", "prmt", "ldmatrix", "ld.shared", "st.shared", "ld.global", "stmatrix"]:
    print(f"  {op}: {p.count(op)}")
  pathlib.Path(f"/tmp/swap_{cfg['BLOCK_N']}_{cfg['TRANS_LOAD']}_{cfg.get('REG_A',0)}.ttgir").write_text(g)
  pathlib.Path(f"/tmp/swap_{cfg['BLOCK_N']}_{cfg['TRANS_LOAD']}_{cfg.get('REG_A',0)}.ptx").write_text(p)
