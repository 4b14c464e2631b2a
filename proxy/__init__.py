"""harnessrl.proxy"""
