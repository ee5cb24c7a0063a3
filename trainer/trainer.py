"""`Trainer`: one optimisation step from finished groups (issue 7, items 2-6).

    groups -> filters -> advantages -> packed (prefix-tree) forward/backward -> AdamW step
           -> metrics dict

`Trainer.step(groups)` is the whole pipeline; `Trainer.train_sequences(seqs)` is the part
after advantages (used by benchmarks and by callers with their own batching). `sync(...)`
exports the weights, calls `push(path)` and bumps the weight version; checkpoints resume the
model, the optimizer, the RNG, the version and the consumed groups of a `GroupWindow`.

Placement: the model moves to `config.device` (default: this rank's GPU when CUDA is present,
else the CPU; `cpu` keeps it, the optimizer and every tensor of a step off CUDA). With
`data_parallel` (torchrun) it is sharded with FSDP2 (distributed.py);
`config.lora` wraps it in PEFT adapters first; `config.precision = "bf16"` keeps fp32 master
weights and computes in bfloat16 (FSDP2 MixedPrecisionPolicy, or torch.autocast in one
process).
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import nullcontext
from pathlib import Path
from typing import TYPE_CHECKING, Any

from envhub.trainer.batch import GroupFate, TrainSequence, build_batch
from envhub.trainer.checkpoint import read_checkpoint, write_checkpoint
from envhub.trainer.config import TrainerConfig
from envhub.trainer.distributed import DataParallel, choose_device, shard_model
from envhub.trainer.errors import PeerFailed, TrainerError, require_torch
from envhub.trainer.forward import tree_logprobs
from envhub.trainer.lora import MergeShell, apply_lora
from envhub.trainer.loss import (
    ADDITIVE,
    LossSums,
    policy_loss,
    resolve_loss,
    token_coefficients,
)
from envhub.trainer.prefix_tree import PackedTree, pack, plan_trees
from envhub.trainer.source import Group
from envhub.trainer.weights import export_weights

if TYPE_CHECKING:
    import torch

    from envhub.trainer.window import GroupWindow


class Trainer:
    """Owns the policy model, its optimizer and the weight version."""

    def __init__(self, model: Any, config: TrainerConfig | None = None, *,
                 reference: Any = None, version: int = 0,
                 data_parallel: DataParallel | None = None, tokenizer: Any = None) -> None:
        require_torch()
        import torch

        self.config = config or TrainerConfig()
        self.loss_fn = resolve_loss(self.config.loss.name)  # a bad plug-in fails here
        if self.config.loss.kl_coef > 0 and reference is None:
            raise ValueError("loss.kl_coef > 0 needs a reference model: pass reference=... "
                             "or set kl_coef to 0")
        self.dp = data_parallel
        cfg = self.config
        self.device = choose_device(cfg.device, self.dp)
        if cfg.attention_mode == "flex" and self.device.type != "cuda":
            raise TrainerError(  # found at construction, not at the first step's backward
                f"tree_attention='flex' trains on CUDA only: FlexAttention has no backward on "
                f"{self.device.type} (torch {torch.__version__}); use 'auto' or 'blocks' here")
        if cfg.precision == "bf16":
            model = model.float()  # fp32 master weights; bf16 only in the compute
        if cfg.lora is not None:
            model = apply_lora(model, cfg.lora)
        self.model = model.to(self.device)
        self.reference = reference.to(self.device) if reference is not None else None
        self.version = version
        self.steps = 0
        self.last_fates: dict[str, GroupFate] = {}  # what the last step made of each group
        self.tokenizer = tokenizer
        self._prepare_models()
        is_rank0 = self.dp is None or self.dp.rank == 0
        self._merge = MergeShell(self.model) if cfg.lora is not None and is_rank0 else None
        self._bf16 = cfg.precision == "bf16"
        if self.dp is not None:
            shard_model(self.model, torch.bfloat16 if self._bf16 else None)
        self.params = [p for p in self.model.parameters() if p.requires_grad]
        self.optimizer = self._new_optimizer()

    def _prepare_models(self) -> None:
        """Tree attention on (refusing models it cannot keep exact) and, if configured,
        activation checkpointing; both stay on for the Trainer's life."""
        from envhub.trainer.distributed import causal_lm, set_activation_checkpointing
        from envhub.trainer.tree_attention import check_tree_forward

        for m in (self.model, self.reference):
            if m is not None:
                check_tree_forward(causal_lm(m), self.config.attention_mode)
        if self.config.gradient_checkpointing:
            set_activation_checkpointing(self.model, True)

    def _new_optimizer(self) -> torch.optim.Optimizer:
        import torch

        o = self.config.optim
        return torch.optim.AdamW(self.params, lr=o.lr, betas=o.betas, eps=o.adam_eps,
                                 weight_decay=o.weight_decay)

    # -- the step ---------------------------------------------------------------------------

    def step(self, groups: list[Group]) -> dict[str, float]:
        """Filters, advantages, one optimizer step over every surviving group."""
        batch = build_batch(groups, self.config, self.version)
        self.last_fates = batch.fates
        metrics = batch.metrics()
        metrics.update(self.train_sequences(batch.sequences))
        return metrics

    def train_sequences(self, sequences: list[TrainSequence]) -> dict[str, float]:
        """Forward/backward over `sequences` (this rank's shard when data-parallel) + update.

        Skips the optimizer step (metric `step/skipped` = 1) when no rank has a loss token.
        """
        import torch

        metrics = self.compute_gradients(sequences)
        if metrics["step/skipped"]:
            return metrics
        clip = self.config.optim.max_grad_norm
        norm = torch.nn.utils.clip_grad_norm_(self.params, clip if clip else float("inf"))
        if hasattr(norm, "full_tensor"):  # a DTensor under FSDP2
            norm = norm.full_tensor()
        self.optimizer.step()
        self.steps += 1
        metrics.update({"grad/norm": float(norm), "step": float(self.steps),
                        "weights/version": float(self.version)})
        return metrics

    def compute_gradients(self, sequences: list[TrainSequence]) -> dict[str, float]:
        """Zero the gradients and accumulate this step's into `.grad` (sharded under FSDP2:
        each rank holds its shard of the summed gradient); returns the step's metrics."""
        local = self._local_shard(sequences)
        n_local = float(sum(s.n_loss_tokens for s in local))
        s_local = float(sum(1 for s in local if s.n_loss_tokens))
        n_total, s_total = (self.dp.sum_floats([n_local, s_local]) if self.dp
                            else (n_local, s_local))
        self.model.train()
        self.optimizer.zero_grad(set_to_none=True)
        sums, packed, naive, paths = self._accumulate(local, n_total, s_total)
        counts = list(paths.values())
        if self.dp:
            packed, naive, *counts = self.dp.sum_floats([packed, naive, *counts])
        metrics = self._reduce_metrics(sums)
        metrics.update({"tokens/packed": packed, "tokens/naive": naive,
                        "step/skipped": float(n_total == 0)})
        metrics.update(zip(paths, counts, strict=True))
        return metrics

    def _local_shard(self, sequences: list[TrainSequence]) -> list[TrainSequence]:
        if self.dp is None or self.dp.world == 1:
            return sequences
        # Shard whole groups so a group's shared prefix stays in one tree.
        order: dict[str, list[TrainSequence]] = {}
        for s in sequences:
            order.setdefault(s.group_id, []).append(s)
        groups = list(order.values())
        mine = self.dp.shard([sum(len(s.token_ids) for s in g) for g in groups])
        return [s for i in mine for s in groups[i]]

    def _pack(self, local: list[TrainSequence]) -> tuple[list[list[int]], list[PackedTree],
                                                         bool]:
        """(sequence indices, packed tree) per forward, and whether they are merged trees:
        with tree_attention "auto" on CUDA, merging only when the token bound is >= 1.1
        (`worth_merging`), else plain packed sequences through the same kernel."""
        from envhub.trainer.tree_attention import worth_merging

        cfg = self.config
        ids = [s.token_ids for s in local]
        merge = cfg.prefix_merge
        for _ in range(2):
            bins = plan_trees(ids, cfg.max_tokens_per_forward, merge)
            trees = [pack([ids[i] for i in b], merge=merge) for b in bins]
            if not merge or cfg.attention_mode != "auto" or worth_merging(
                    sum(t.n_sequence_tokens for t in trees), sum(t.n_nodes for t in trees),
                    self.device.type):
                break
            merge = False
        return bins, trees, merge

    def _accumulate(self, local: list[TrainSequence], n_total: float, s_total: float
                    ) -> tuple[LossSums, float, float, dict[str, float]]:
        """Backward over every packed tree of this rank; gradients accumulate in .grad.
        `n_total`, `s_total`: the step's loss tokens and sequences with one, on every rank
        (the aggregation's counts). Also returns how many forwards ran in each attention mode
        and merged/unmerged."""
        import torch

        from envhub.trainer.tree_attention import MODES

        cfg = self.config
        sums = LossSums()
        packed = naive = 0.0
        scale = self.dp.loss_scale() if self.dp else 1.0
        bins, trees, merged = self._pack(local)
        paths = {f"attention/{m}": 0.0 for m in MODES}
        paths.update({"tree/merged": 0.0, "tree/unmerged": 0.0})
        # FSDP2's collectives run in every forward/backward, so every rank must run as many
        # passes as the rank with the most trees: agree on that count *before* the first pass
        # (a rank that asked after its own passes met its peer's all-gathers with its
        # all-reduce: both waited until gloo's 30-minute timeout), then a rank with fewer
        # trees, or none (its shard is empty), runs empty passes.
        empty_passes = 0
        if self.dp is not None:
            _, most = self.dp.min_max(0.0, float(len(bins)))
            empty_passes = int(most) - len(bins)
        for indices, tree in zip(bins, trees, strict=True):
            seqs = [local[i] for i in indices]
            masks = [s.loss_mask for s in seqs]
            packed += tree.n_nodes
            naive += tree.n_sequence_tokens
            out = self._logprobs(self.model, tree, masks)
            paths[f"attention/{out.attention}"] += 1
            paths["tree/merged" if merged else "tree/unmerged"] += 1
            device = out.logprobs.device
            flat = _flat_index(seqs, out.seq_index, out.token_index)
            rollout = torch.tensor([x for s in seqs for x in s.rollout_logprobs],
                                   dtype=torch.float32)[flat].to(device)
            adv = torch.tensor([x for s in seqs for x in s.advantages],
                               dtype=torch.float32)[flat].to(device)
            ref = None
            if self.reference is not None and cfg.loss.kl_coef > 0:
                with torch.no_grad():
                    ref = self._logprobs(self.reference, tree, masks, with_entropy=False
                                         ).logprobs
            per_seq = torch.tensor(token_coefficients([q.n_loss_tokens for q in seqs], n_total,
                                                      s_total, cfg.loss), dtype=torch.float32)
            coef = per_seq[out.seq_index].to(device)
            loss, s = policy_loss(out.logprobs, rollout, adv, out.seq_index.to(device),
                                  len(seqs), coef, cfg.loss, fn=self.loss_fn,
                                  entropy=out.entropy, ref_logprobs=ref)
            (loss * scale).backward()
            sums.add(s)
        for _ in range(empty_passes):  # a 2-token tree, loss x 0: the collectives only
            out = self._logprobs(self.model, pack([[0, 0]]), [[0, 1]])
            (out.logprobs.sum() * 0.0).backward()
        return sums, packed, naive, paths

    def _logprobs(self, model: Any, tree: Any, masks: list[list[int]],
                  with_entropy: bool = True) -> Any:
        """`tree_logprobs` in the configured precision (autocast in one process; FSDP2 casts
        the parameters itself)."""
        import torch

        sharded = self.dp is not None and model is self.model
        autocast = self._bf16 and not sharded
        ctx = torch.autocast(self.device.type, dtype=torch.bfloat16) if autocast else (
            nullcontext())
        with ctx:
            return tree_logprobs(model, tree, masks, with_entropy=with_entropy,
                                 attention=self.config.attention_mode,
                                 compute_dtype=torch.bfloat16 if self._bf16 and sharded
                                 else None)

    def _reduce_metrics(self, sums: LossSums) -> dict[str, float]:
        if self.dp:
            totals = self.dp.sum_floats([getattr(sums, n) for n in ADDITIVE])
            for name, value in zip(ADDITIVE, totals, strict=True):
                setattr(sums, name, value)
            sums.ratio_min, sums.ratio_max = self.dp.min_max(sums.ratio_min, sums.ratio_max)
        return sums.metrics(self.config.loss.correction)

    # -- weights, checkpoints ---------------------------------------------------------------

    def sync(self, root: str | Path, push: Callable[[str], None] | None = None, *,
             bump: bool = True) -> Path | None:
        """Export weights as version+1 under `root`, push them, bump the version. Without
        `bump`, the weights as they are, as the current version (a resumed run serves its
        checkpoint's weights again); the optimizer is then left as it is.

        Collective under FSDP2: the full state is gathered to rank 0, which alone writes and
        pushes; a failed push raises on every rank. Returns the folder on rank 0 and None
        elsewhere. Resets the optimizer when `reset_optimizer_on_sync`.
        """
        is_rank0 = self.dp is None or self.dp.rank == 0
        version = self.version + 1 if bump else self.version
        path = export_weights(self.model, root, version, self.tokenizer,
                              is_rank0=is_rank0, merge=self._merge)
        error: Exception | None = None
        if path is not None and push is not None:
            try:
                push(str(path))
            except Exception as exc:  # every rank must hear of it, not wait forever
                error = exc
        if self.dp is not None:
            failed = self.dp.sum_floats([float(error is not None)])[0]
            if failed and error is None:
                raise PeerFailed("the weight push on rank 0 failed (see rank 0's error); "
                                 "the weight version was not bumped")
        if error is not None:
            raise error
        if not bump:
            return path
        self.version += 1
        if self.config.optim.reset_optimizer_on_sync:
            self.optimizer.state.clear()
        return path

    def save_checkpoint(self, folder: str | Path, window: GroupWindow | None = None, *,
                        extra: dict[str, Any] | None = None,
                        files: dict[str, Path] | None = None) -> Path:
        """Model, optimizer, RNG, version, steps and the window's consumed groups; `extra`
        (JSON) goes into trainer_state.json beside them, `files` are copied in."""
        state = {**(extra or {}), "version": self.version, "steps": self.steps,
                 "config": self.config.model_dump(mode="json"),
                 "consumed_groups": sorted(window.consumed) if window else []}
        return write_checkpoint(folder, self.model, self.optimizer, state, self.dp, files)

    def load_checkpoint(self, folder: str | Path, window: GroupWindow | None = None
                        ) -> dict[str, Any]:
        """Load a `save_checkpoint` folder in place; returns its trainer_state.json."""
        state = read_checkpoint(folder, self.model, self.optimizer, self.dp)
        self.version = int(state["version"])
        self.steps = int(state["steps"])
        if window is not None:
            window.restore(state.get("consumed_groups", []))
        return state


def _flat_index(seqs: list[TrainSequence], seq_index: torch.Tensor,
                token_index: torch.Tensor) -> torch.Tensor:
    """Index into the concatenation of the sequences' per-token arrays."""
    import torch

    offsets = torch.tensor([0] + [len(s.token_ids) for s in seqs[:-1]]).cumsum(0)
    return offsets[seq_index] + token_index
