# full comment
echo visible # trailing comment
