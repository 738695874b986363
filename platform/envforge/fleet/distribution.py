"""Image distribution over the fleet: which node has which image, and getting one onto a node
that lacks it before a sandbox is placed there.

The dispatcher decides where a sandbox goes; this decides how its image gets there (`images`
holds the per-engine steps: docker save/load, a build from a recipe). Per (node, image) one
transfer or build at a time; `FleetConfig.image_distribution` chooses between building from a
registered recipe (task images: a small layer over a parent the node can get) and a transfer
from a node that has the image (through Ray's object store, node to node), or from the driver's
own engine when no node has it yet. What each node holds is kept on its `NodeState.images`,
which placement scores by.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Any

from envforge.errors import InfraError
from envforge.fleet.images import ImageRecipe, export_image
from envforge.fleet.node import Fault
from envforge.fleet.raycalls import lost_errors, ray_module, root_message
from envforge.sandbox.images import image_exists

if TYPE_CHECKING:
    from envforge.fleet.dispatcher import FleetDispatcher, NodeState


class ImageDistribution:
    """Thread-safe. Calls nodes through its dispatcher (`call`, `alive_nodes`) and reports there
    (`on_event`, and `stats.builds` / `stats.transfers`)."""

    def __init__(self, dispatcher: FleetDispatcher):
        self.dispatcher = dispatcher
        self.recipes: dict[str, ImageRecipe] = {}
        self.origin: Any = None  # the driver's own engine (a docker client), when it has one: images start there
        self._locks: dict[tuple[str, str], threading.Lock] = {}
        self._locks_guard = threading.Lock()

    def register_recipe(self, recipe: ImageRecipe) -> None:
        self.recipes[recipe.tag] = recipe

    def ensure(self, node: NodeState, tag: str) -> None:
        """Make sure `tag` is on `node`: build it from its recipe or transfer it from a node that has it."""
        if tag in node.images:
            return
        with self._locks_guard:
            lock = self._locks.setdefault((node.node_id, tag), threading.Lock())
        with lock:
            if tag in node.images:
                return
            d = self.dispatcher
            if d.call(node, "has_image", tag, timeout_s=120):
                node.images.add(tag)
                return
            recipe = self.recipes.get(tag)
            mode = d.config.image_distribution
            if recipe is not None and mode in ("auto", "build"):
                self.ensure(node, recipe.parent)
                d.call(node, "build_image", recipe, timeout_s=1800)
                d.stats.builds += 1
                d.on_event(f"node {node.name}: built {tag}")
            else:
                self._transfer(node, tag)
            node.images.add(tag)

    def _transfer(self, node: NodeState, tag: str) -> None:
        ray = ray_module()
        d = self.dispatcher
        sources = [n for n in d.alive_nodes() if n is not node and tag in n.images]
        if not sources:
            for n in d.alive_nodes():
                if n is not node and d.call(n, "has_image", tag, timeout_s=120):
                    n.images.add(tag)
                    sources.append(n)
                    break
        if not sources:
            if self.origin is not None:
                if image_exists(self.origin, tag):
                    self.push(tag, export_image(self.origin, tag), [node])
                    d.stats.transfers += 1
                    d.on_event(f"node {node.name}: received {tag} from the driver's engine")
                    return
            raise InfraError("image_missing", f"image {tag} is on no node and has no recipe to build it from")
        source = sources[0]
        try:
            data_ref = source.handle.export_image.remote(tag)  # stays in the object store, node to node
            result = ray.get(node.handle.import_image.remote(data_ref, tag), timeout=1800)
        except (*lost_errors(), ray.exceptions.RayTaskError) as exc:
            raise InfraError(
                "image_transfer_failed", f"{tag} from {source.name} to {node.name}: {root_message(exc)}"
            ) from None
        if isinstance(result, Fault):
            raise result.rebuild()
        d.stats.transfers += 1
        d.on_event(f"node {node.name}: received {tag} from {source.name}")

    def push(self, tag: str, data: bytes, nodes: list[NodeState] | None = None) -> int:
        """Load an image from this driver's own engine onto nodes that lack it (the first seeding)."""
        ray = ray_module()
        d = self.dispatcher
        ref = None
        loaded = 0
        for node in nodes or d.alive_nodes():
            if tag in node.images or d.call(node, "has_image", tag, timeout_s=120):
                node.images.add(tag)
                continue
            ref = ref or ray.put(data)
            d.call(node, "import_image", ref, tag, timeout_s=1800)
            node.images.add(tag)
            loaded += 1
        return loaded
