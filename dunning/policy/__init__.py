"""Dunning policies: the document, its checks, durations and vocabulary, the validated-document cache,
rollout modes and publishing; the shipped policies in shipped/*.yaml."""
