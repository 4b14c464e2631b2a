"""harnessrl.harness_examples"""
