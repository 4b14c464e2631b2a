"""harnessrl.trainer"""
