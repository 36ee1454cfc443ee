mkdir -p app/src app/tests
echo 'print(1)' > app/src/main.py
echo 'assert True' > app/tests/test_main.py
echo '# App' > app/README.md
find app -type f | sort
