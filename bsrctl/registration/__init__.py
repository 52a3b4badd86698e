"""Registrations as bsrctl derives, declares and checks them: from a model's config
(``derive``, ``from_vllm``), from a YAML declaration (``declared``), the paper's DeepSeek-V4
geometry (``dsv4``, ``dsv4_vllm``), LMCache's L1 allocation unit (``l1``) and the live
registration a server reports (``live``). The geometry itself (``Registration``) is the
mechanisms' (``bsrkv.registration``)."""
