touch .dot plain
ls -a
