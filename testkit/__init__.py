"""Helpers shared by tests/ and bench/ (neither imports the other): tiny synthetic pretraining
data (`synthetic`), a plain re-statement of the original model (`reference_model`), and running
deepspeed_train.py through the real `deepspeed` launcher (`launcher`)."""
