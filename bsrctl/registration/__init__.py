"""Registrations as bsrctl derives, declares and checks them: from a model's config
(``derive``, ``from_vllm``), from a YAML declaration (``declared``), DeepSeek-V4's geometry
as vLLM registers it and as the paper gives it (``dsv4``, ``dsv4_vllm``), the tiny models'
recipes and the tiny Llama's registration (``tiny``), LMCache's L1 allocation unit (``l1``)
and the live registration a server reports (``live``). The geometry itself
(``Registration``) is the mechanisms' (``bsrkv.registration``)."""
