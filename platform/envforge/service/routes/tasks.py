"""The task sets a key may use, and their tasks (with the prompt and tools to act with)."""

from __future__ import annotations

import asyncio
from typing import Any

from fastapi import APIRouter, Depends

from envforge.service import models as m
from envforge.service.routes.deps import instructions, responses, session_manager, tenant
from envforge.service.sessions import SessionManager
from envforge.service.tasks import task_summary
from envforge.service.tenants import Tenant

router = APIRouter(tags=["tasks"])


@router.get("/task-sets", response_model=m.TaskSetList, responses=responses(401))
async def list_task_sets(t: Tenant = Depends(tenant), mgr: SessionManager = Depends(session_manager)) -> dict[str, Any]:
    infos = await asyncio.to_thread(mgr.directory.task_sets, t)
    return {"task_sets": [i.__dict__ for i in infos]}


@router.get("/task-sets/{task_set}/tasks", response_model=m.TaskList, responses=responses(401, 404))
async def list_tasks(
    task_set: str,
    t: Tenant = Depends(tenant),
    mgr: SessionManager = Depends(session_manager),
    prompt_and_tools: dict[str, Any] = Depends(instructions),
) -> dict[str, Any]:
    info, tasks = await asyncio.to_thread(mgr.directory.tasks, t, task_set)
    return {"task_set": info.__dict__, **prompt_and_tools, "tasks": [task_summary(s) for s in tasks]}
