"""Does at::_grouped_mm on this GPU give right answers when expert groups
are not multiples of 16 rows? Compares with per-expert matmuls in fp32."""
import torch

torch.manual_seed(0)
for aligned in (False, True):
    E, K, N = 8, 256, 512
    sizes = torch.randint(1, 60, (E,))
    if aligned:
        sizes = (sizes + 15) // 16 * 16
    offs = sizes.cumsum(0).to(torch.int32).cuda()
    x = torch.randn(int(sizes.sum()), K, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(E, N, K, device="cuda", dtype=torch.bfloat16)
    y = torch._grouped_mm(x, w.transpose(-2, -1), offs=offs).float()
    ref = torch.cat([x[a:b].float() @ w[e].float().t() for e, (a, b) in
                     enumerate(zip([0] + offs.tolist()[:-1], offs.tolist()))])
    print(f"grouped_mm bf16 aligned={aligned}: rel err {((y - ref).norm() / ref.norm()).item():.2e}")
