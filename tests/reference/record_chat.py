#!/usr/bin/env python3
"""Records the reference renderings of real chat templates for tests/unit/test_chat.c.

Renders the chat templates of real models (their tokenizer.chat_template text,
written below) with jinja2 the way Hugging Face transformers' apply_chat_template
does (sandboxed environment, trim_blocks, lstrip_blocks, loopcontrols,
raise_exception) for a fixed set of message lists, with and without
add_generation_prompt, and stores template text + bos/eos + messages + the
expected output in tests/fixtures/ref_chat.json.

Where the real template raises (Gemma before Gemma 3 and the legacy Mistral
template have no system role) the case records the exception in "jinja_error"
and, in "expected", what potserve renders on purpose instead: the system text
merged into the first user turn the way the family's newer template does it
(Gemma 3, Mistral v1), itself rendered with jinja2 from that newer template or
from the same template with the merge applied to the messages ("lenient": true).

jinja2 is a test-time reference only, never a runtime dependency of potserve.

usage: python3 tests/reference/record_chat.py [--check] [OUT.json]   (needs jinja2)
--check renders everything in memory and exits 1 when it differs from the
stored fixture (the file is not written).
"""
import argparse
import json
import os
import sys

import jinja2
from jinja2.ext import loopcontrols
from jinja2.exceptions import TemplateError
from jinja2.sandbox import ImmutableSandboxedEnvironment

TEMPLATES = [
    {
        'name': 'SmolLM2-Instruct',
        'family': 'chatml',
        'bos': '<|im_start|>',
        'eos': '<|im_end|>',
        'template': (
            "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}{{ '<|im_start|>system\n"
            'You are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n'
            "' }}{% endif %}{{'<|im_start|>' + message['role'] + '\n"
            "' + message['content'] + '<|im_end|>' + '\n"
            "'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n"
            "' }}{% endif %}"
        ),
    },
    {
        'name': 'Qwen2-Instruct',
        'family': 'chatml',
        'bos': '',
        'eos': '<|im_end|>',
        'template': (
            "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}{{ '<|im_start|>system\n"
            'You are a helpful assistant.<|im_end|>\n'
            "' }}{% endif %}{{'<|im_start|>' + message['role'] + '\n"
            "' + message['content'] + '<|im_end|>' + '\n"
            "'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n"
            "' }}{% endif %}"
        ),
    },
    {
        'name': 'Qwen2.5-Instruct',
        'family': 'chatml',
        'bos': '',
        'eos': '<|im_end|>',
        'template': (
            '{%- if tools %}\n'
            "    {{- '<|im_start|>system\\n' }}\n"
            "    {%- if messages[0]['role'] == 'system' %}\n"
            "        {{- messages[0]['content'] }}\n"
            '    {%- else %}\n'
            "        {{- 'You are Qwen, created by Alibaba Cloud. You are a helpful assistant.' }}\n"
            '    {%- endif %}\n'
            '    {{- "\\n\\n# Tools\\n\\nYou may call one or more functions to assist with the user query.\\n\\nYou are provided with function signatures within <tools></tools> XML tags:\\n<tools>" }}\n'
            '    {%- for tool in tools %}\n'
            '        {{- "\\n" }}\n'
            '        {{- tool | tojson }}\n'
            '    {%- endfor %}\n'
            '    {{- "\\n</tools>\\n\\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\\n<tool_call>\\n{\\"name\\": <function-name>, \\"arguments\\": <args-json-object>}\\n</tool_call><|im_end|>\\n" }}\n'
            '{%- else %}\n'
            "    {%- if messages[0]['role'] == 'system' %}\n"
            "        {{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}\n"
            '    {%- else %}\n'
            "        {{- '<|im_start|>system\\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\\n' }}\n"
            '    {%- endif %}\n'
            '{%- endif %}\n'
            '{%- for message in messages %}\n'
            '    {%- if (message.role == "user") or (message.role == "system" and not loop.first) or (message.role == "assistant" and not message.tool_calls) %}\n'
            "        {{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>' + '\\n' }}\n"
            '    {%- elif message.role == "assistant" %}\n'
            "        {{- '<|im_start|>' + message.role }}\n"
            '        {%- if message.content %}\n'
            "            {{- '\\n' + message.content }}\n"
            '        {%- endif %}\n'
            '        {%- for tool_call in message.tool_calls %}\n'
            '            {%- if tool_call.function is defined %}\n'
            '                {%- set tool_call = tool_call.function %}\n'
            '            {%- endif %}\n'
            '            {{- \'\\n<tool_call>\\n{"name": "\' }}\n'
            '            {{- tool_call.name }}\n'
            '            {{- \'", "arguments": \' }}\n'
            '            {{- tool_call.arguments | tojson }}\n'
            "            {{- '}\\n</tool_call>' }}\n"
            '        {%- endfor %}\n'
            "        {{- '<|im_end|>\\n' }}\n"
            '    {%- elif message.role == "tool" %}\n'
            '        {%- if (loop.index0 == 0) or (messages[loop.index0 - 1].role != "tool") %}\n'
            "            {{- '<|im_start|>user' }}\n"
            '        {%- endif %}\n'
            "        {{- '\\n<tool_response>\\n' }}\n"
            '        {{- message.content }}\n'
            "        {{- '\\n</tool_response>' }}\n"
            '        {%- if loop.last or (messages[loop.index0 + 1].role != "tool") %}\n'
            "            {{- '<|im_end|>\\n' }}\n"
            '        {%- endif %}\n'
            '    {%- endif %}\n'
            '{%- endfor %}\n'
            '{%- if add_generation_prompt %}\n'
            "    {{- '<|im_start|>assistant\\n' }}\n"
            '{%- endif %}\n'
        ),
    },
    {
        'name': 'OpenHermes-2.5 (plain ChatML)',
        'family': 'chatml',
        'bos': '<s>',
        'eos': '<|im_end|>',
        'template': (
            "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
        ),
    },
    {
        'name': 'Llama-2-chat',
        'family': 'llama2',
        'bos': '<s>',
        'eos': '</s>',
        'template': (
            "{% if messages[0]['role'] == 'system' %}{% set loop_messages = messages[1:] %}{% set system_message = messages[0]['content'] %}{% else %}{% set loop_messages = messages %}{% set system_message = false %}{% endif %}{% for message in loop_messages %}{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}{% if loop.index0 == 0 and system_message != false %}{% set content = '<<SYS>>\\n' + system_message + '\\n<</SYS>>\\n\\n' + message['content'] %}{% else %}{% set content = message['content'] %}{% endif %}{% if message['role'] == 'user' %}{{ bos_token + '[INST] ' + content.strip() + ' [/INST]' }}{% elif message['role'] == 'assistant' %}{{ ' '  + content.strip() + ' ' + eos_token }}{% endif %}{% endfor %}"
        ),
    },
    {
        'name': 'Llama-3-Instruct',
        'family': 'llama3',
        'bos': '<|begin_of_text|>',
        'eos': '<|eot_id|>',
        'template': (
            "{% set loop_messages = messages %}{% for message in loop_messages %}{% set content = '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n"
            '\n'
            "'+ message['content'] | trim + '<|eot_id|>' %}{% if loop.index0 == 0 %}{% set content = bos_token + content %}{% endif %}{{ content }}{% endfor %}{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\n"
            '\n'
            "' }}{% endif %}"
        ),
    },
    {
        'name': 'Llama-3.1-Instruct',
        'family': 'llama3',
        'bos': '<|begin_of_text|>',
        'eos': '<|eot_id|>',
        'template': (
            '{{- bos_token }}\n'
            '{%- if custom_tools is defined %}\n'
            '    {%- set tools = custom_tools %}\n'
            '{%- endif %}\n'
            '{%- if not tools_in_user_message is defined %}\n'
            '    {%- set tools_in_user_message = true %}\n'
            '{%- endif %}\n'
            '{%- if not date_string is defined %}\n'
            '    {%- set date_string = "26 Jul 2024" %}\n'
            '{%- endif %}\n'
            '{%- if not tools is defined %}\n'
            '    {%- set tools = none %}\n'
            '{%- endif %}\n'
            '\n'
            '{#- This block extracts the system message, so we can slot it into the right place. #}\n'
            "{%- if messages[0]['role'] == 'system' %}\n"
            "    {%- set system_message = messages[0]['content']|trim %}\n"
            '    {%- set messages = messages[1:] %}\n'
            '{%- else %}\n'
            '    {%- set system_message = "" %}\n'
            '{%- endif %}\n'
            '\n'
            '{#- System message + builtin tools #}\n'
            '{{- "<|start_header_id|>system<|end_header_id|>\\n\\n" }}\n'
            '{%- if builtin_tools is defined or tools is not none %}\n'
            '    {{- "Environment: ipython\\n" }}\n'
            '{%- endif %}\n'
            '{%- if builtin_tools is defined %}\n'
            '    {{- "Tools: " + builtin_tools | reject(\'equalto\', \'code_interpreter\') | join(", ") + "\\n\\n"}}\n'
            '{%- endif %}\n'
            '{{- "Cutting Knowledge Date: December 2023\\n" }}\n'
            '{{- "Today Date: " + date_string + "\\n\\n" }}\n'
            '{%- if tools is not none and not tools_in_user_message %}\n'
            '    {{- "You have access to the following functions. To call a function, please respond with JSON for a function call." }}\n'
            '    {{- \'Respond in the format {"name": function name, "parameters": dictionary of argument name and its value}.\' }}\n'
            '    {{- "Do not use variables.\\n\\n" }}\n'
            '    {%- for t in tools %}\n'
            '        {{- t | tojson(indent=4) }}\n'
            '        {{- "\\n\\n" }}\n'
            '    {%- endfor %}\n'
            '{%- endif %}\n'
            '{{- system_message }}\n'
            '{{- "<|eot_id|>" }}\n'
            '\n'
            '{#- Custom tools are passed in a user message with some extra guidance #}\n'
            '{%- if tools_in_user_message and not tools is none %}\n'
            '    {#- Extract the first user message so we can plug it in here #}\n'
            '    {%- if messages | length != 0 %}\n'
            "        {%- set first_user_message = messages[0]['content']|trim %}\n"
            '        {%- set messages = messages[1:] %}\n'
            '    {%- else %}\n'
            '        {{- raise_exception("Cannot put tools in the first user message when there\'s no first user message!") }}\n'
            '{%- endif %}\n'
            "    {{- '<|start_header_id|>user<|end_header_id|>\\n\\n' -}}\n"
            '    {{- "Given the following functions, please respond with a JSON for a function call " }}\n'
            '    {{- "with its proper arguments that best answers the given prompt.\\n\\n" }}\n'
            '    {{- \'Respond in the format {"name": function name, "parameters": dictionary of argument name and its value}.\' }}\n'
            '    {{- "Do not use variables.\\n\\n" }}\n'
            '    {%- for t in tools %}\n'
            '        {{- t | tojson(indent=4) }}\n'
            '        {{- "\\n\\n" }}\n'
            '    {%- endfor %}\n'
            '    {{- first_user_message + "<|eot_id|>"}}\n'
            '{%- endif %}\n'
            '\n'
            '{%- for message in messages %}\n'
            "    {%- if not (message.role == 'ipython' or message.role == 'tool' or 'tool_calls' in message) %}\n"
            "        {{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n'+ message['content'] | trim + '<|eot_id|>' }}\n"
            "    {%- elif 'tool_calls' in message %}\n"
            '        {%- if not message.tool_calls|length == 1 %}\n'
            '            {{- raise_exception("This model only supports single tool-calls at once!") }}\n'
            '        {%- endif %}\n'
            '        {%- set tool_call = message.tool_calls[0].function %}\n'
            '        {%- if builtin_tools is defined and tool_call.name in builtin_tools %}\n'
            "            {{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' -}}\n"
            '            {{- "<|python_tag|>" + tool_call.name + ".call(" }}\n'
            '            {%- for arg_name, arg_val in tool_call.arguments | items %}\n'
            '                {{- arg_name + \'="\' + arg_val + \'"\' }}\n'
            '                {%- if not loop.last %}\n'
            '                    {{- ", " }}\n'
            '                {%- endif %}\n'
            '                {%- endfor %}\n'
            '            {{- ")" }}\n'
            '        {%- else  %}\n'
            "            {{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' -}}\n"
            '            {{- \'{"name": "\' + tool_call.name + \'", \' }}\n'
            '            {{- \'"parameters": \' }}\n'
            '            {{- tool_call.arguments | tojson }}\n'
            '            {{- "}" }}\n'
            '        {%- endif %}\n'
            '        {%- if builtin_tools is defined %}\n'
            "            {#- This means we're in ipython mode #}\n"
            '            {{- "<|eom_id|>" }}\n'
            '        {%- else %}\n'
            '            {{- "<|eot_id|>" }}\n'
            '        {%- endif %}\n'
            '    {%- elif message.role == "tool" or message.role == "ipython" %}\n'
            '        {{- "<|start_header_id|>ipython<|end_header_id|>\\n\\n" }}\n'
            '        {%- if message.content is mapping or message.content is iterable %}\n'
            '            {{- message.content | tojson }}\n'
            '        {%- else %}\n'
            '            {{- message.content }}\n'
            '        {%- endif %}\n'
            '        {{- "<|eot_id|>" }}\n'
            '    {%- endif %}\n'
            '{%- endfor %}\n'
            '{%- if add_generation_prompt %}\n'
            "    {{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}\n"
            '{%- endif %}\n'
        ),
    },
    {
        'name': 'Mistral-7B-Instruct-v0.2 (v1 template)',
        'family': 'mistral',
        'bos': '<s>',
        'eos': '</s>',
        'template': (
            "{%- if messages[0]['role'] == 'system' %}\n"
            "    {%- set system_message = messages[0]['content'] %}\n"
            '    {%- set loop_messages = messages[1:] %}\n'
            '{%- else %}\n'
            '    {%- set loop_messages = messages %}\n'
            '{%- endif %}\n'
            '\n'
            '{{- bos_token }}\n'
            '{%- for message in loop_messages %}\n'
            "    {%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}\n"
            "        {{- raise_exception('After the optional system message, conversation roles must alternate user/assistant/user/assistant/...') }}\n"
            '    {%- endif %}\n'
            "    {%- if message['role'] == 'user' %}\n"
            '        {%- if loop.first and system_message is defined %}\n'
            "            {{- ' [INST] ' + system_message + '\\n\\n' + message['content'] + ' [/INST]' }}\n"
            '        {%- else %}\n'
            "            {{- ' [INST] ' + message['content'] + ' [/INST]' }}\n"
            '        {%- endif %}\n'
            "    {%- elif message['role'] == 'assistant' %}\n"
            "        {{- ' ' + message['content'] + eos_token}}\n"
            '    {%- else %}\n'
            "        {{- raise_exception('Only user and assistant roles are supported, with the exception of an initial optional system message!') }}\n"
            '    {%- endif %}\n'
            '{%- endfor %}\n'
        ),
    },
    {
        'name': 'Mistral-7B-Instruct-v0.2 (legacy template)',
        'family': 'mistral',
        'bos': '<s>',
        'eos': '</s>',
        'template': (
            "{{ bos_token }}{% for message in messages %}{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}{% if message['role'] == 'user' %}{{ '[INST] ' + message['content'] + ' [/INST]' }}{% elif message['role'] == 'assistant' %}{{ message['content'] + eos_token}}{% else %}{{ raise_exception('Only user and assistant roles are supported!') }}{% endif %}{% endfor %}"
        ),
    },
    {
        'name': 'Mistral v3 (Mistral-Large-Instruct-2407)',
        'family': 'mistral',
        'bos': '<s>',
        'eos': '</s>',
        'template': (
            '{%- if messages[0]["role"] == "system" %}\n'
            '    {%- set system_message = messages[0]["content"] %}\n'
            '    {%- set loop_messages = messages[1:] %}\n'
            '{%- else %}\n'
            '    {%- set loop_messages = messages %}\n'
            '{%- endif %}\n'
            '{%- if not tools is defined %}\n'
            '    {%- set tools = none %}\n'
            '{%- endif %}\n'
            '{%- set user_messages = loop_messages | selectattr("role", "equalto", "user") | list %}\n'
            '\n'
            '{#- This block checks for alternating user/assistant messages, skipping tool calling messages #}\n'
            '{%- set ns = namespace() %}\n'
            '{%- set ns.index = 0 %}\n'
            '{%- for message in loop_messages %}\n'
            '    {%- if not (message.role == "tool" or message.role == "tool_results" or (message.tool_calls is defined and message.tool_calls is not none)) %}\n'
            '        {%- if (message["role"] == "user") != (ns.index % 2 == 0) %}\n'
            '            {{- raise_exception("After the optional system message, conversation roles must alternate user/assistant/user/assistant/...") }}\n'
            '        {%- endif %}\n'
            '        {%- set ns.index = ns.index + 1 %}\n'
            '    {%- endif %}\n'
            '{%- endfor %}\n'
            '\n'
            '{{- bos_token }}\n'
            '{%- for message in loop_messages %}\n'
            '    {%- if message["role"] == "user" %}\n'
            '        {%- if tools is not none and (message == user_messages[-1]) %}\n'
            '            {{- "[AVAILABLE_TOOLS] [" }}\n'
            '            {%- for tool in tools %}\n'
            '                {%- set tool = tool.function %}\n'
            '                {{- \'{"type": "function", "function": {\' }}\n'
            '                {%- for key, val in tool.items() if key != "return" %}\n'
            '                    {%- if val is string %}\n'
            '                        {{- \'"\' + key + \'": "\' + val + \'"\' }}\n'
            '                    {%- else %}\n'
            '                        {{- \'"\' + key + \'": \' + val|tojson }}\n'
            '                    {%- endif %}\n'
            '                    {%- if not loop.last %}\n'
            '                        {{- ", " }}\n'
            '                    {%- endif %}\n'
            '                {%- endfor %}\n'
            '                {{- "}}" }}\n'
            '                {%- if not loop.last %}\n'
            '                    {{- ", " }}\n'
            '                {%- else %}\n'
            '                    {{- "]" }}\n'
            '                {%- endif %}\n'
            '            {%- endfor %}\n'
            '            {{- "[/AVAILABLE_TOOLS]" }}\n'
            '            {%- endif %}\n'
            '        {%- if loop.last and system_message is defined %}\n'
            '            {{- "[INST] " + system_message + "\\n\\n" + message["content"] + "[/INST]" }}\n'
            '        {%- else %}\n'
            '            {{- "[INST] " + message["content"] + "[/INST]" }}\n'
            '        {%- endif %}\n'
            '    {%- elif message.tool_calls is defined and message.tool_calls is not none %}\n'
            '        {{- "[TOOL_CALLS] [" }}\n'
            '        {%- for tool_call in message.tool_calls %}\n'
            '            {%- set out = tool_call.function|tojson %}\n'
            '            {{- out[:-1] }}\n'
            '            {%- if not tool_call.id is defined or tool_call.id|length != 9 %}\n'
            '                {{- raise_exception("Tool call IDs should be alphanumeric strings with length 9!") }}\n'
            '            {%- endif %}\n'
            '            {{- \', "id": "\' + tool_call.id + \'"}\' }}\n'
            '            {%- if not loop.last %}\n'
            '                {{- ", " }}\n'
            '            {%- else %}\n'
            '                {{- "]" + eos_token }}\n'
            '            {%- endif %}\n'
            '        {%- endfor %}\n'
            '    {%- elif message["role"] == "assistant" %}\n'
            '        {{- " " + message["content"]|trim + eos_token}}\n'
            '    {%- elif message["role"] == "tool_results" or message["role"] == "tool" %}\n'
            '        {%- if message.content is defined and message.content.content is defined %}\n'
            '            {%- set content = message.content.content %}\n'
            '        {%- else %}\n'
            '            {%- set content = message.content %}\n'
            '        {%- endif %}\n'
            '        {{- \'[TOOL_RESULTS] {"content": \' + content|string + ", " }}\n'
            '        {%- if not message.tool_call_id is defined or message.tool_call_id|length != 9 %}\n'
            '            {{- raise_exception("Tool call IDs should be alphanumeric strings with length 9!") }}\n'
            '        {%- endif %}\n'
            '        {{- \'"call_id": "\' + message.tool_call_id + \'"}[/TOOL_RESULTS]\' }}\n'
            '    {%- else %}\n'
            '        {{- raise_exception("Only user and assistant roles are supported, with the exception of an initial optional system message!") }}\n'
            '    {%- endif %}\n'
            '{%- endfor %}\n'
        ),
    },
    {
        'name': 'Mistral v3-tekken (Mistral-Nemo-Instruct-2407)',
        'family': 'mistral',
        'bos': '<s>',
        'eos': '</s>',
        'template': (
            '{%- if messages[0]["role"] == "system" %}\n'
            '    {%- set system_message = messages[0]["content"] %}\n'
            '    {%- set loop_messages = messages[1:] %}\n'
            '{%- else %}\n'
            '    {%- set loop_messages = messages %}\n'
            '{%- endif %}\n'
            '{%- if not tools is defined %}\n'
            '    {%- set tools = none %}\n'
            '{%- endif %}\n'
            '{%- set user_messages = loop_messages | selectattr("role", "equalto", "user") | list %}\n'
            '\n'
            '{#- This block checks for alternating user/assistant messages, skipping tool calling messages #}\n'
            '{%- set ns = namespace() %}\n'
            '{%- set ns.index = 0 %}\n'
            '{%- for message in loop_messages %}\n'
            '    {%- if not (message.role == "tool" or message.role == "tool_results" or (message.tool_calls is defined and message.tool_calls is not none)) %}\n'
            '        {%- if (message["role"] == "user") != (ns.index % 2 == 0) %}\n'
            '            {{- raise_exception("After the optional system message, conversation roles must alternate user/assistant/user/assistant/...") }}\n'
            '        {%- endif %}\n'
            '        {%- set ns.index = ns.index + 1 %}\n'
            '    {%- endif %}\n'
            '{%- endfor %}\n'
            '\n'
            '{{- bos_token }}\n'
            '{%- for message in loop_messages %}\n'
            '    {%- if message["role"] == "user" %}\n'
            '        {%- if tools is not none and (message == user_messages[-1]) %}\n'
            '            {{- "[AVAILABLE_TOOLS][" }}\n'
            '            {%- for tool in tools %}\n'
            '                {%- set tool = tool.function %}\n'
            '                {{- \'{"type": "function", "function": {\' }}\n'
            '                {%- for key, val in tool.items() if key != "return" %}\n'
            '                    {%- if val is string %}\n'
            '                        {{- \'"\' + key + \'": "\' + val + \'"\' }}\n'
            '                    {%- else %}\n'
            '                        {{- \'"\' + key + \'": \' + val|tojson }}\n'
            '                    {%- endif %}\n'
            '                    {%- if not loop.last %}\n'
            '                        {{- ", " }}\n'
            '                    {%- endif %}\n'
            '                {%- endfor %}\n'
            '                {{- "}}" }}\n'
            '                {%- if not loop.last %}\n'
            '                    {{- ", " }}\n'
            '                {%- else %}\n'
            '                    {{- "]" }}\n'
            '                {%- endif %}\n'
            '            {%- endfor %}\n'
            '            {{- "[/AVAILABLE_TOOLS]" }}\n'
            '            {%- endif %}\n'
            '        {%- if loop.last and system_message is defined %}\n'
            '            {{- "[INST]" + system_message + "\\n\\n" + message["content"] + "[/INST]" }}\n'
            '        {%- else %}\n'
            '            {{- "[INST]" + message["content"] + "[/INST]" }}\n'
            '        {%- endif %}\n'
            '    {%- elif (message.tool_calls is defined and message.tool_calls is not none) %}\n'
            '        {{- "[TOOL_CALLS][" }}\n'
            '        {%- for tool_call in message.tool_calls %}\n'
            '            {%- set out = tool_call.function|tojson %}\n'
            '            {{- out[:-1] }}\n'
            '            {%- if not tool_call.id is defined or tool_call.id|length != 9 %}\n'
            '                {{- raise_exception("Tool call IDs should be alphanumeric strings with length 9!") }}\n'
            '            {%- endif %}\n'
            '            {{- \', "id": "\' + tool_call.id + \'"}\' }}\n'
            '            {%- if not loop.last %}\n'
            '                {{- ", " }}\n'
            '            {%- else %}\n'
            '                {{- "]" + eos_token }}\n'
            '            {%- endif %}\n'
            '        {%- endfor %}\n'
            '    {%- elif message["role"] == "assistant" %}\n'
            '        {{- message["content"] + eos_token}}\n'
            '    {%- elif message["role"] == "tool_results" or message["role"] == "tool" %}\n'
            '        {%- if message.content is defined and message.content.content is defined %}\n'
            '            {%- set content = message.content.content %}\n'
            '        {%- else %}\n'
            '            {%- set content = message.content %}\n'
            '        {%- endif %}\n'
            '        {{- \'[TOOL_RESULTS]{"content": \' + content|string + ", " }}\n'
            '        {%- if not message.tool_call_id is defined or message.tool_call_id|length != 9 %}\n'
            '            {{- raise_exception("Tool call IDs should be alphanumeric strings with length 9!") }}\n'
            '        {%- endif %}\n'
            '        {{- \'"call_id": "\' + message.tool_call_id + \'"}[/TOOL_RESULTS]\' }}\n'
            '    {%- else %}\n'
            '        {{- raise_exception("Only user and assistant roles are supported, with the exception of an initial optional system message!") }}\n'
            '    {%- endif %}\n'
            '{%- endfor %}\n'
        ),
    },
    {
        'name': 'Zephyr-7b-beta',
        'family': 'zephyr',
        'bos': '<s>',
        'eos': '</s>',
        'template': (
            '{% for message in messages %}\n'
            "{% if message['role'] == 'user' %}\n"
            "{{ '<|user|>\n"
            "' + message['content'] + eos_token }}\n"
            "{% elif message['role'] == 'system' %}\n"
            "{{ '<|system|>\n"
            "' + message['content'] + eos_token }}\n"
            "{% elif message['role'] == 'assistant' %}\n"
            "{{ '<|assistant|>\n"
            "'  + message['content'] + eos_token }}\n"
            '{% endif %}\n'
            '{% if loop.last and add_generation_prompt %}\n'
            "{{ '<|assistant|>' }}\n"
            '{% endif %}\n'
            '{% endfor %}'
        ),
    },
    {
        'name': 'Gemma-2-it',
        'family': 'gemma',
        'bos': '<bos>',
        'eos': '<eos>',
        'template': (
            "{{ bos_token }}{% if messages[0]['role'] == 'system' %}{{ raise_exception('System role not supported') }}{% endif %}{% for message in messages %}{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}{% if (message['role'] == 'assistant') %}{% set role = 'model' %}{% else %}{% set role = message['role'] %}{% endif %}{{ '<start_of_turn>' + role + '\n"
            "' + message['content'] | trim + '<end_of_turn>\n"
            "' }}{% endfor %}{% if add_generation_prompt %}{{'<start_of_turn>model\n"
            "'}}{% endif %}"
        ),
    },
    {
        'name': 'Gemma-7b-it',
        'family': 'gemma',
        'bos': '<bos>',
        'eos': '<eos>',
        'template': (
            "{% if messages[0]['role'] == 'system' %}{{ raise_exception('System role not supported') }}{% endif %}{% for message in messages %}{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}{% if (message['role'] == 'assistant') %}{% set role = 'model' %}{% else %}{% set role = message['role'] %}{% endif %}{{ '<start_of_turn>' + role + '\\n' + message['content'] | trim + '<end_of_turn>\\n' }}{% endfor %}{% if add_generation_prompt %}{{'<start_of_turn>model\\n'}}{% endif %}"
        ),
    },
    {
        'name': 'Gemma-3-it',
        'family': 'gemma',
        'bos': '<bos>',
        'eos': '<eos>',
        'template': (
            '{{ bos_token }}\n'
            "{%- if messages[0]['role'] == 'system' -%}\n"
            "    {%- if messages[0]['content'] is string -%}\n"
            "        {%- set first_user_prefix = messages[0]['content'] + '\\n\\n' -%}\n"
            '    {%- else -%}\n'
            "        {%- set first_user_prefix = messages[0]['content'][0]['text'] + '\\n\\n' -%}\n"
            '    {%- endif -%}\n'
            '    {%- set loop_messages = messages[1:] -%}\n'
            '{%- else -%}\n'
            '    {%- set first_user_prefix = "" -%}\n'
            '    {%- set loop_messages = messages -%}\n'
            '{%- endif -%}\n'
            '{%- for message in loop_messages -%}\n'
            "    {%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) -%}\n"
            '        {{ raise_exception("Conversation roles must alternate user/assistant/user/assistant/...") }}\n'
            '    {%- endif -%}\n'
            "    {%- if (message['role'] == 'assistant') -%}\n"
            '        {%- set role = "model" -%}\n'
            '    {%- else -%}\n'
            "        {%- set role = message['role'] -%}\n"
            '    {%- endif -%}\n'
            '    {{ \'<start_of_turn>\' + role + \'\\n\' + (first_user_prefix if loop.first else "") }}\n'
            "    {%- if message['content'] is string -%}\n"
            "        {{ message['content'] | trim }}\n"
            "    {%- elif message['content'] is iterable -%}\n"
            "        {%- for item in message['content'] -%}\n"
            "            {%- if item['type'] == 'image' -%}\n"
            "                {{ '<start_of_image>' }}\n"
            "            {%- elif item['type'] == 'text' -%}\n"
            "                {{ item['text'] | trim }}\n"
            '            {%- endif -%}\n'
            '        {%- endfor -%}\n'
            '    {%- else -%}\n'
            '        {{ raise_exception("Invalid content type") }}\n'
            '    {%- endif -%}\n'
            "    {{ '<end_of_turn>\\n' }}\n"
            '{%- endfor -%}\n'
            '{%- if add_generation_prompt -%}\n'
            "    {{'<start_of_turn>model\\n'}}\n"
            '{%- endif -%}\n'
        ),
    },
    {
        'name': 'Qwen3 (Qwen/Qwen3-0.6B)',
        'family': 'qwen3',
        'bos': '',
        'eos': '<|im_end|>',
        'options': [{}, {'enable_thinking': False}],
        'template': '{%- if tools %}\n    {{- \'<|im_start|>system\\n\' }}\n    {%- if messages[0].role == \'system\' %}\n        {{- messages[0].content + \'\\n\\n\' }}\n    {%- endif %}\n    {{- "# Tools\\n\\nYou may call one or more functions to assist with the user query.\\n\\nYou are provided with function signatures within <tools></tools> XML tags:\\n<tools>" }}\n    {%- for tool in tools %}\n        {{- "\\n" }}\n        {{- tool | tojson }}\n    {%- endfor %}\n    {{- "\\n</tools>\\n\\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\\n<tool_call>\\n{\\"name\\": <function-name>, \\"arguments\\": <args-json-object>}\\n</tool_call><|im_end|>\\n" }}\n{%- else %}\n    {%- if messages[0].role == \'system\' %}\n        {{- \'<|im_start|>system\\n\' + messages[0].content + \'<|im_end|>\\n\' }}\n    {%- endif %}\n{%- endif %}\n{%- set ns = namespace(multi_step_tool=true, last_query_index=messages|length - 1) %}\n{%- for message in messages[::-1] %}\n    {%- set index = (messages|length - 1) - loop.index0 %}\n    {%- if ns.multi_step_tool and message.role == "user" and not(message.content.startswith(\'<tool_response>\') and message.content.endswith(\'</tool_response>\')) %}\n        {%- set ns.multi_step_tool = false %}\n        {%- set ns.last_query_index = index %}\n    {%- endif %}\n{%- endfor %}\n{%- for message in messages %}\n    {%- if (message.role == "user") or (message.role == "system" and not loop.first) %}\n        {{- \'<|im_start|>\' + message.role + \'\\n\' + message.content + \'<|im_end|>\' + \'\\n\' }}\n    {%- elif message.role == "assistant" %}\n        {%- set content = message.content %}\n        {%- set reasoning_content = \'\' %}\n        {%- if message.reasoning_content is defined and message.reasoning_content is not none %}\n            {%- set reasoning_content = message.reasoning_content %}\n        {%- else %}\n            {%- if \'</think>\' in message.content %}\n                {%- set content = message.content.split(\'</think>\')[-1].lstrip(\'\\n\') %}\n                {%- set reasoning_content = message.content.split(\'</think>\')[0].rstrip(\'\\n\').split(\'<think>\')[-1].lstrip(\'\\n\') %}\n            {%- endif %}\n        {%- endif %}\n        {%- if loop.index0 > ns.last_query_index %}\n            {%- if loop.last or (not loop.last and reasoning_content) %}\n                {{- \'<|im_start|>\' + message.role + \'\\n<think>\\n\' + reasoning_content.strip(\'\\n\') + \'\\n</think>\\n\\n\' + content.lstrip(\'\\n\') }}\n            {%- else %}\n                {{- \'<|im_start|>\' + message.role + \'\\n\' + content }}\n            {%- endif %}\n        {%- else %}\n            {{- \'<|im_start|>\' + message.role + \'\\n\' + content }}\n        {%- endif %}\n        {%- if message.tool_calls %}\n            {%- for tool_call in message.tool_calls %}\n                {%- if (loop.first and content) or (not loop.first) %}\n                    {{- \'\\n\' }}\n                {%- endif %}\n                {%- if tool_call.function %}\n                    {%- set tool_call = tool_call.function %}\n                {%- endif %}\n                {{- \'<tool_call>\\n{"name": "\' }}\n                {{- tool_call.name }}\n                {{- \'", "arguments": \' }}\n                {%- if tool_call.arguments is string %}\n                    {{- tool_call.arguments }}\n                {%- else %}\n                    {{- tool_call.arguments | tojson }}\n                {%- endif %}\n                {{- \'}\\n</tool_call>\' }}\n            {%- endfor %}\n        {%- endif %}\n        {{- \'<|im_end|>\\n\' }}\n    {%- elif message.role == "tool" %}\n        {%- if loop.first or (messages[loop.index0 - 1].role != "tool") %}\n            {{- \'<|im_start|>user\' }}\n        {%- endif %}\n        {{- \'\\n<tool_response>\\n\' }}\n        {{- message.content }}\n        {{- \'\\n</tool_response>\' }}\n        {%- if loop.last or (messages[loop.index0 + 1].role != "tool") %}\n            {{- \'<|im_end|>\\n\' }}\n        {%- endif %}\n    {%- endif %}\n{%- endfor %}\n{%- if add_generation_prompt %}\n    {{- \'<|im_start|>assistant\\n\' }}\n    {%- if enable_thinking is defined and enable_thinking is false %}\n        {{- \'<think>\\n\\n</think>\\n\\n\' }}\n    {%- endif %}\n{%- endif %}',
    },
    {
        'name': 'Phi-3.5-mini-instruct',
        'family': 'phi3',
        'bos': '<s>',
        'eos': '<|endoftext|>',
        'template': "{% for message in messages %}{% if message['role'] == 'system' and message['content'] %}{{'<|system|>\n' + message['content'] + '<|end|>\n'}}{% elif message['role'] == 'user' %}{{'<|user|>\n' + message['content'] + '<|end|>\n'}}{% elif message['role'] == 'assistant' %}{{'<|assistant|>\n' + message['content'] + '<|end|>\n'}}{% endif %}{% endfor %}{% if add_generation_prompt %}{{ '<|assistant|>\n' }}{% else %}{{ eos_token }}{% endif %}",
    },
]

SYS = 'You are a helpful assistant.'

# Message lists: (name, messages). Every list alternates user/assistant after an
# optional leading system message, as all of these templates require.
CASES = [
    ('system+user', [
        {'role': 'system', 'content': SYS},
        {'role': 'user', 'content': 'Hello'}]),
    ('user only', [
        {'role': 'user', 'content': 'Hello'}]),
    ('multi-turn with system', [
        {'role': 'system', 'content': SYS},
        {'role': 'user', 'content': 'Hi there'},
        {'role': 'assistant', 'content': 'Hello! How can I help you today?'},
        {'role': 'user', 'content': 'What is 2+2?'}]),
    ('multi-turn without system', [
        {'role': 'user', 'content': 'Who are you'},
        {'role': 'assistant', 'content': '   I am an assistant   '},
        {'role': 'user', 'content': 'Another question'}]),
    ('ends with assistant', [
        {'role': 'system', 'content': SYS},
        {'role': 'user', 'content': 'Say hi'},
        {'role': 'assistant', 'content': 'hi'}]),
    ('empty user content', [
        {'role': 'user', 'content': ''}]),
    ('empty system and user content', [
        {'role': 'system', 'content': ''},
        {'role': 'user', 'content': ''}]),
    ('system only', [
        {'role': 'system', 'content': SYS}]),
    ('multi-line content', [
        {'role': 'system', 'content': 'Line one.\nLine two.\n'},
        {'role': 'user', 'content': '\nfirst\n\nsecond\n'},
        {'role': 'assistant', 'content': '\n- a\n- b\n'},
        {'role': 'user', 'content': 'ok\n'}]),
    ('unicode', [
        {'role': 'system', 'content': 'Tu es un assistant serviable. 日本語で答えて。'},
        {'role': 'user', 'content': '\u3000\u00a0 Ünïcödé — emoji 🤖 and “quotes” \u2028'},
        {'role': 'assistant', 'content': '\u2003Привет! 你好 👋\u00a0'},
        {'role': 'user', 'content': 'Ça va? 🙂'}]),
    ('special characters', [
        {'role': 'user', 'content': "{{ not jinja }} {% raw %} 'single' \"double\" \\back\\slash"}]),
]

# Reasoning turns for the templates that show or drop <think> blocks (Qwen3).
THINKING_CASES = [
    ('thinking in history', [
        {'role': 'user', 'content': 'What is 2+2?'},
        {'role': 'assistant', 'content': '<think>\nAdd them.\n</think>\n\n4'},
        {'role': 'user', 'content': 'And 3+3?'}]),
    ('thinking after the last query', [
        {'role': 'system', 'content': SYS},
        {'role': 'user', 'content': 'Say hi'},
        {'role': 'assistant', 'content': '<think>\n\nA greeting.\n\n</think>\n\nhi'}]),
    ('two replies after the last query', [
        {'role': 'user', 'content': 'Q'},
        {'role': 'assistant', 'content': 'first, no reasoning'},
        {'role': 'assistant', 'content': 'second'}]),
    ('reasoning on an earlier reply after the query', [
        {'role': 'user', 'content': 'Q'},
        {'role': 'assistant', 'content': '<think>r1</think>a1'},
        {'role': 'assistant', 'content': 'a2\n'}]),
    ('tool response is not a query', [
        {'role': 'user', 'content': 'look it up'},
        {'role': 'assistant', 'content': '<think>need a tool</think>calling'},
        {'role': 'user', 'content': '<tool_response>42</tool_response>'},
        {'role': 'assistant', 'content': '<think>got it</think>\nIt is 42.'}]),
    ('nested think markers', [
        {'role': 'user', 'content': 'x'},
        {'role': 'assistant', 'content': 'pre<think>\n\nA<think>B\n</think>\nmid</think>\n\ntail'}]),
    ('later system message', [
        {'role': 'user', 'content': 'a'},
        {'role': 'system', 'content': 'be brief'},
        {'role': 'user', 'content': 'b'}]),
]

# For templates without a system role: the family whose template merges it.
LENIENT_SOURCE = {
    'Gemma-2-it': 'Gemma-3-it',
    'Gemma-7b-it': 'Gemma-3-it',
}


def raise_exception(message):
    raise TemplateError(message)


def make_env():
    # What transformers' apply_chat_template compiles templates with.
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[loopcontrols])
    env.filters['tojson'] = lambda x, indent=None, separators=None, sort_keys=False: \
        json.dumps(x, ensure_ascii=False, indent=indent, separators=separators,
                   sort_keys=sort_keys)
    env.globals['raise_exception'] = raise_exception
    return env


def render(env, tpl, messages, agp, options=None):
    return env.from_string(tpl['template']).render(
        messages=messages, add_generation_prompt=agp,
        bos_token=tpl['bos'], eos_token=tpl['eos'], **(options or {}))


def merge_system(messages):
    """Mistral v1's way: system text + "\\n\\n" + first user message."""
    if not messages or messages[0]['role'] != 'system':
        return messages
    rest = [dict(m) for m in messages[1:]]
    if rest and rest[0]['role'] == 'user':
        rest[0]['content'] = messages[0]['content'] + '\n\n' + rest[0]['content']
    return rest


def build():
    env = make_env()
    by_name = {t['name']: t for t in TEMPLATES}
    result = {'generator': 'tests/reference/record_chat.py',
              'jinja_env': 'ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, loopcontrols)',
              'templates': []}
    n_exact = n_lenient = 0
    for tpl in TEMPLATES:
        entry = {k: tpl[k] for k in ('name', 'family', 'bos', 'eos', 'template')}
        entry['cases'] = []
        cases = CASES + (THINKING_CASES if tpl['family'] == 'qwen3' else [])
        for (case_name, messages), options, agp in [(c, o, a) for c in cases for o in tpl.get('options', [{}])
                                                    for a in (False, True)]:
            case = {'name': case_name, 'add_generation_prompt': agp, 'messages': messages, **options}
            try:
                case['expected'] = render(env, tpl, messages, agp, options)
                n_exact += 1
            except TemplateError as e:
                case['jinja_error'] = str(e)
                src = LENIENT_SOURCE.get(tpl['name'])
                if src:  # the merging template of the family, with this one's BOS use
                    bos = tpl['bos'] if 'bos_token' in tpl['template'] else ''
                    other = dict(by_name[src], bos=bos, eos=tpl['eos'])
                    case['expected'] = render(env, other, messages, agp)
                else:
                    case['expected'] = render(env, tpl, merge_system(messages), agp)
                case['lenient'] = True
                n_lenient += 1
            entry['cases'].append(case)
        result['templates'].append(entry)
    return result, n_exact, n_lenient


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    ap = argparse.ArgumentParser(description='record jinja2 renderings of real chat templates')
    ap.add_argument('--check', action='store_true',
                    help='compare with the stored fixture instead of writing it')
    ap.add_argument('out', nargs='?',
                    default=os.path.normpath(os.path.join(here, '..', 'fixtures', 'ref_chat.json')))
    args = ap.parse_args()
    result, n_exact, n_lenient = build()
    if args.check:
        with open(args.out, encoding='utf-8') as f:
            stored = json.load(f)
        if stored != result:
            print(f'{args.out}: differs from what jinja2 {jinja2.__version__} renders now '
                  f'(re-run without --check to update)', file=sys.stderr)
            return 1
        print(f'{args.out}: up to date ({n_exact} jinja renderings, {n_lenient} lenient cases)')
        return 0
    with open(args.out, 'w', encoding='utf-8') as f:
        json.dump(result, f, ensure_ascii=False, indent=1)
        f.write('\n')
    print(f'{args.out}: {len(TEMPLATES)} templates, {n_exact} jinja renderings, '
          f'{n_lenient} lenient cases')
    return 0


if __name__ == '__main__':
    sys.exit(main())
