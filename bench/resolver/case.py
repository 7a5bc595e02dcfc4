"""One timed case of the resolver benchmark: the sync-free path (lookup, then commit + miss
copies of one payload layer) on a ``State``, and its correctness check."""

from __future__ import annotations

import torch

from bench.resolver.pool import PAGE_ROWS, TAIL_ROWS, State


class Case:
    def __init__(
        self,
        st: State,
        host: torch.Tensor,
        pool: torch.Tensor,
        item: int,
        bs: int,
        K: int,
        k: int,
        m: int,
        cold: bool,
    ) -> None:
        from kernels import resolver as kres

        self.kres, self.st, self.host, self.pool, self.item = kres, st, host, pool, item
        self.bs, self.K, self.k, self.m, self.cold = bs, K, k, m, cold
        dev = pool.device
        self.ws = kres.Workspace.new(bs, K * k, st.B, dev)
        self.table = st.table(bs)
        base = host.data_ptr()
        self.host_ptrs = torch.tensor(
            [[base + r * st.S * item for r in range(bs)]], dtype=torch.int64, device=dev
        )
        self.payloads = torch.tensor([pool.data_ptr()], dtype=torch.int64, device=dev)
        self.visible = torch.full((bs, K), st.S, dtype=torch.int64, device=dev)
        self.locs = torch.empty(bs, K, k, dtype=torch.int64, device=dev)
        n = bs * K * k
        self.out = kres.CopyList(*(torch.empty(n, dtype=torch.int64, device=dev) for _ in range(4)))
        self.sels: dict[int, torch.Tensor] = {}
        self.copy_blocks: int | None = None  # blocks of the miss copies (None = default)
        self.select: str | None = None  # victim ordering (None = DHISPARSE_VICTIM_SELECT)
        self.early: bool | None = None  # copy blocks' preload (None = DHISPARSE_COPY_EARLY)
        self.tma: bool | None = None  # copies by the TMA (None = DHISPARSE_COPY_TMA)

    def sel(self, i: int) -> torch.Tensor:
        if i not in self.sels:
            self.sels[i] = self.st.selection(self.bs, self.K, self.k, self.m, i, self.cold)
        return self.sels[i]

    def before(self, i: int) -> None:
        self.sel(i)
        self.st.restore(self.cold)

    def call(self, i: int) -> None:
        self.lookup(i)
        self.commit(i)
        self.st.held_changed |= self.cold or self.m > 0

    def lookup(self, i: int) -> None:
        kres, st = self.kres, self.st
        kres.lookup(
            self.ws,
            self.table,
            self.sels[i],
            self.visible,
            self.locs,
            hot_slots=st.B,
            tail_rows=TAIL_ROWS,
            page_rows=PAGE_ROWS,
            rows_bound=st.tail_lo,
            finished_epoch=st.finished_epoch,
            select=self.select,
            host_totals=False,  # sync-free: the commit sums the batch
        )

    def commit(self, i: int) -> None:
        kres, st = self.kres, self.st
        kres.commit(
            self.ws,
            self.table,
            self.sels[i],
            self.locs,
            st.stage_locs,
            self.out,
            epoch=st.epoch,
            hot_slots=st.B,
            host_ptrs=self.host_ptrs,
            payloads=self.payloads,
            row_bytes=self.item,
            copy_blocks=self.copy_blocks,
            early=self.early,
            tma=self.tma,
            dependent=True,  # right behind the lookup: PDL unless DHISPARSE_PDL=0
        )

    def check(self, i: int) -> dict:
        """One call from the restored state: every location holds its host row, every selected
        row is resident afterwards, each distinct missed row was copied exactly once."""
        self.before(i)
        n, dev = min(self.bs, 16), self.pool.device
        if not self.cold:  # device rows of the resident slots hold their host rows (hits)
            rows = (self.st.res[:n] + torch.arange(n, device=dev)[:, None] * self.st.S).flatten()
            rows = rows.to(self.host.device)
            dst = self.st.hot_locs[:n].flatten()
            self.pool[dst] = self.host.view(-1, self.item)[rows].to(self.pool.device)
        self.locs.fill_(-7)
        self.call(i)
        torch.cuda.synchronize()
        sel, locs = self.sels[i], self.locs
        totals = self.ws.totals[:9].tolist()
        rows = (sel[:n].cpu() + torch.arange(n)[:, None, None] * self.st.S).flatten()
        # the host pool may be a CUDA-typed tensor (bench pool mode "vmm")
        want = self.host.view(-1, self.item)[rows.to(self.host.device)].cpu()
        got = self.pool[locs[:n].flatten()].cpu()
        hot = self.st.hot_rows[: self.bs].sort(1).values
        pos = torch.searchsorted(hot, sel[:, 0, :].contiguous()).clamp(max=self.st.B - 1)
        unique = (
            sum(int(torch.unique(sel[b]).numel()) for b in range(self.bs))
            if not self.cold
            else self.bs * self.k
        )
        res = {
            "status": totals[0],
            "copies": totals[1],
            "want_copies": self.m * self.bs if not self.cold else unique,
            "data_equal": bool(torch.equal(got, want)),
            "rows_compared": int(rows.numel()),
            "selected_resident": bool((hot.gather(1, pos) == sel[:, 0, :]).all()),
        }
        res["ok"] = (
            res["status"] == 0
            and res["data_equal"]
            and res["selected_resident"]
            and res["copies"] == res["want_copies"]
        )
        return res
