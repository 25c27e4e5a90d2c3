"""P-GenRM training: teacher chains (PSI), and the data each training stage consumes.

Importing any module of this package registers ``tiny-genrm``'s tokenizer corpus (the chain vocabulary) with the
model sources, which sit below this package and cannot import it: every entry point that trains or loads P-GenRM
imports a module of this package before it resolves ``tiny-genrm``.
"""
from pr_rlhf.models.sources import register_tokenizer_corpus
from pr_rlhf.pgenrm.tokenizer_corpus import genrm_corpus

register_tokenizer_corpus("tiny-genrm", genrm_corpus)
