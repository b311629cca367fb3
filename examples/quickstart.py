import torch

from spherenet.models import from_preset
from spherenet.optim import build_optimizer, sphere_parameters

model = from_preset("ngpt-tiny")  # nGPT: weight rows and hidden states on the unit sphere; byte vocabulary
optimizer, schedule = build_optimizer(model, "riemannian_adam", lr=1e-2, total_steps=100)  # keeps rows unit

ids = torch.randint(0, 256, (8, 65))  # 8 sequences of byte tokens
loss = torch.nn.functional.cross_entropy(model(ids[:, :-1]).flatten(0, 1), ids[:, 1:].flatten())
loss.backward()
optimizer.step()
schedule.step()
drift = max((p.norm(dim=-1) - 1).abs().max().item() for p in sphere_parameters(model))
print(f"loss {loss.item():.3f}, largest |row norm - 1| after the step: {drift:.1e}")
