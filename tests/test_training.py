"""Training through the family protocol: the contrastive losses, pretraining every image
family (save, reload, same embeddings), LoRA on open_clip towers, and adapters merged at a
strength."""

from __future__ import annotations

import math
import re

import pytest
import torch

from ptc import targets
from ptc.compiler.edit.lora import attach_lora
from ptc.lab.tiny import hf_clip, hf_siglip, openclip  # the tiny builders
from ptc.lab.zoo.pretrain import PretrainConfig, contrastive_loss, pretrain
from ptc.targets.openclip import OpenClip


def _tiny_eva(folder):
    return openclip.build_tiny_eva(folder, embed_dim=16, text_width=32, text_layers=2, heads=2)


BUILDERS = {
    "hf-clip": (lambda f: f"hf:{hf_clip.build_tiny(f, width=32, embed_dim=16)}", 32),
    "hf-siglip": (lambda f: f"hf:{hf_siglip.build_tiny(f, width=32)}", 32),
    "open_clip-vit": (lambda f: f"open_clip:local-dir:{openclip.build_tiny(f)}", 32),
    "open_clip-resnet": (lambda f: f"open_clip:local-dir:{openclip.build_tiny_resnet(f)}", 64),
    "open_clip-eva": (lambda f: f"open_clip:local-dir:{_tiny_eva(f)}", 32),
}
CAPTIONS = [
    "a red circle.",
    "two blue squares.",
    "a red circle.",
    "the digit three at the top left.",
    "a green ring.",
    "on a striped background.",
    "four yellow crosses.",
    "a photo of a thing.",
]


def _pixels(size: int, n: int = len(CAPTIONS)) -> dict:
    return {
        "pixel_values": torch.randn(n, 3, size, size, generator=torch.Generator().manual_seed(0))
    }


def test_softmax_loss_is_clips_symmetric_cross_entropy_with_shared_captions_as_positives():
    torch.manual_seed(0)
    image, text = (torch.nn.functional.normalize(torch.randn(4, 8), dim=1) for _ in range(2))
    log_scale, bias = torch.tensor(math.log(10.0)), torch.tensor(0.0)
    eye = torch.eye(4, dtype=torch.bool)
    logits = 10 * image @ text.T
    clip = (
        torch.nn.functional.cross_entropy(logits, torch.arange(4))
        + torch.nn.functional.cross_entropy(logits.T, torch.arange(4))
    ) / 2
    assert torch.allclose(contrastive_loss("softmax", image, text, eye, log_scale, bias), clip)
    # Captions 0 and 2 are the same: each row's target spreads over both.
    same = eye.clone()
    same[0, 2] = same[2, 0] = True
    rows = torch.log_softmax(logits, 1)
    columns = torch.log_softmax(logits.T, 1)
    by_hand = 0.0
    for i in range(4):
        positives = same[i].nonzero().flatten()
        by_hand += -(rows[i, positives].mean() + columns[i, positives].mean()) / 2
    assert torch.allclose(
        contrastive_loss("softmax", image, text, same, log_scale, bias), by_hand / 4
    )


def test_sigmoid_loss_is_siglips_pairwise_loss():
    torch.manual_seed(1)
    image, text = (torch.nn.functional.normalize(torch.randn(3, 8), dim=1) for _ in range(2))
    log_scale, bias = torch.tensor(math.log(10.0)), torch.tensor(-10.0)
    by_hand = 0.0
    for i in range(3):
        for j in range(3):
            sign = 1.0 if i == j else -1.0
            by_hand += -math.log(1 / (1 + math.exp(-sign * (10 * float(image[i] @ text[j]) - 10))))
    measured = contrastive_loss(
        "sigmoid", image, text, torch.eye(3, dtype=torch.bool), log_scale, bias
    )
    assert measured.item() == pytest.approx(by_hand / 3, rel=1e-5)
    with pytest.raises(ValueError, match="unknown contrastive loss 'triplet'"):
        contrastive_loss("triplet", image, text, torch.eye(3, dtype=torch.bool), log_scale, bias)


@pytest.mark.parametrize("family", list(BUILDERS))
def test_pretraining_trains_both_towers_and_the_saved_model_reloads_identically(family, tmp_path):
    build, size = BUILDERS[family]
    encoder = targets.load(build(tmp_path / "init"))
    pixels = _pixels(size)
    before_image, before_text = encoder.embed_inputs(pixels), encoder.embed_prompts(CAPTIONS)
    trained, figures = pretrain(
        encoder,
        pixels,
        CAPTIONS,
        PretrainConfig(steps=3, batch_size=4, lr=1e-2, warmup=1),
        progress=False,
        device=torch.device("cpu"),
    )
    assert figures["loss"] == encoder.contrastive_loss and figures["steps"] == 3
    after_image, after_text = trained.embed_inputs(pixels), trained.embed_prompts(CAPTIONS)
    assert (after_image - before_image).abs().max() > 1e-3 and (
        after_text - before_text
    ).abs().max() > 1e-3
    assert torch.equal(encoder.embed_inputs(pixels), before_image)  # the original is untouched
    scheme = trained.save_native(tmp_path / "saved")
    reloaded = targets.load(f"{scheme}:{tmp_path / 'saved'}")
    assert torch.allclose(reloaded.embed_inputs(pixels), after_image, atol=1e-6)
    assert torch.allclose(reloaded.embed_prompts(CAPTIONS), after_text, atol=1e-6)


def test_siglip_pretrains_with_the_sigmoid_loss_and_clip_with_softmax():
    assert hf_siglip.HFSiglip.contrastive_loss == "sigmoid"
    assert hf_clip.HFClip.contrastive_loss == "softmax" == OpenClip.contrastive_loss


def _perturb_lora(module, seed: int = 0) -> None:
    generator = torch.Generator().manual_seed(seed)
    for name, parameter in module.named_parameters():
        if parameter.requires_grad and "lora_B" in name:
            parameter.data.copy_(0.1 * torch.randn(parameter.shape, generator=generator))


@pytest.mark.parametrize("family", ["open_clip-vit", "open_clip-resnet", "open_clip-eva"])
def test_lora_on_open_clip_towers_trains_the_image_tower_only_and_merges_exactly(family, tmp_path):
    build, size = BUILDERS[family]
    encoder = targets.load(build(tmp_path / "m"))
    # open_clip zero-initialises bn3: a fresh tower's residual branches are off
    if family == "open_clip-resnet":
        for name, parameter in encoder.model.named_parameters():
            if name.endswith("bn3.weight"):
                parameter.data.fill_(1.0)
    module = attach_lora(encoder, rank=4, alpha=8, seed=0, device=torch.device("cpu"))
    trainable = [n for n, p in module.named_parameters() if p.requires_grad]
    assert trainable and all(".visual." in n and "lora_" in n for n in trainable)
    if family == "open_clip-eva":  # separate projections: the paper's q and v, nothing else
        assert {n.split(".lora_")[0].rsplit(".", 1)[-1] for n in trainable} == {"q_proj", "v_proj"}
    _perturb_lora(module)
    pixels = _pixels(size, 2)
    live = encoder.embed_with(module, pixels).detach()
    # not bypassed (a bypass moves exactly 0)
    assert (live - encoder.embed_inputs(pixels)).abs().max() > 1e-6
    module.save_pretrained(tmp_path / "adapter")
    merged = encoder.with_adapter(tmp_path / "adapter")
    assert torch.allclose(merged.embed_inputs(pixels), live, atol=1e-5)
    assert merged.text_fingerprint() == encoder.text_fingerprint()


def test_an_adapter_merged_at_half_strength_moves_the_weights_half_way(tmp_path):
    encoder = targets.load(f"hf:{hf_clip.build_tiny(tmp_path / 'm', width=32, embed_dim=16)}")
    module = attach_lora(encoder, rank=4, alpha=8, seed=0, device=torch.device("cpu"))
    _perturb_lora(module)
    module.save_pretrained(tmp_path / "adapter")
    base = encoder.model.state_dict()
    full = encoder.with_adapter(tmp_path / "adapter").model.state_dict()
    half = encoder.with_adapter(tmp_path / "adapter", scale=0.5).model.state_dict()
    moved = [k for k in base if not torch.equal(base[k], full[k])]
    assert moved and all("q_proj" in k or "v_proj" in k for k in moved)
    for key in moved:
        assert torch.allclose(half[key] - base[key], 0.5 * (full[key] - base[key]), atol=1e-6)


def test_a_checkpoint_naming_ptcs_own_timm_tower_loads_in_a_fresh_process(tmp_path):
    """open_clip builds the tower by its timm name, which only the lab registers: loading, with the
    lab installed, must do it (its plugin adds the tower hook)."""
    import subprocess
    import sys

    ref = f"open_clip:local-dir:{_tiny_eva(tmp_path / 'eva')}"
    expected = targets.load(ref).embed_inputs(_pixels(32, 2))
    code = (
        "import sys, torch; from ptc import targets; e = targets.load(sys.argv[1]); "
        "g = torch.Generator().manual_seed(0); "
        "print(e.embed_inputs({'pixel_values': torch.randn(2, 3, 32, 32, generator=g)}).sum().item())"
    )
    result = subprocess.run(
        [sys.executable, "-c", code, ref], capture_output=True, text=True, check=True
    )
    assert float(result.stdout.strip()) == pytest.approx(expected.sum().item(), rel=1e-5, abs=1e-5)


def test_pretraining_logs_plain_progress_lines_when_no_terminal_shows_its_bar(
    tmp_path, capsys, monkeypatch
):
    from ptc import progress

    build, size = BUILDERS["hf-clip"]
    encoder = targets.load(build(tmp_path / "init"))
    config = PretrainConfig(steps=40, batch_size=4, lr=1e-2, warmup=1)
    monkeypatch.setattr(progress, "LINE_SECONDS", 0.0)  # a line per step, not one per 10 s
    pretrain(
        encoder, _pixels(size), CAPTIONS, config, desc="pretrain clip", device=torch.device("cpu")
    )
    lines = capsys.readouterr().err.splitlines()  # captured: not a terminal, so plain lines
    assert [line.split(",")[0] for line in lines] == [
        f"pretrain clip: {n}/40 steps" for n in range(1, 41)
    ] + ["pretrain clip: 40/40 steps"]
    assert re.fullmatch(
        r"pretrain clip: 39/40 steps, loss \d+\.\d{3}, \d+\.\d s, about \d+\.\d s left", lines[-3]
    )
    assert re.fullmatch(r"pretrain clip: 40/40 steps, loss \d+\.\d{3}, \d+\.\d s done", lines[-1])
    pretrain(encoder, _pixels(size), CAPTIONS, config, progress=False, device=torch.device("cpu"))
    assert capsys.readouterr().err == ""
