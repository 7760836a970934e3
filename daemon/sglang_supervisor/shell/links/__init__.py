"""The other side of a link: the SGLang Model Gateway (registration, drain) and the multi-node group link
(leader and workers, its secret)."""
