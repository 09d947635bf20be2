"""Chat formats: tool-call parsing / rendering and conversation encoding with policy masks."""

from slca.chat.encoding import (
    ChatRenderer,
    EncodedConversation,
    TemplateNotPrefixPreserving,
    encode_conversation,
    find_training_template,
    template_messages,
)
from slca.chat.formats import (
    ERROR_KINDS,
    HermesFormat,
    JsonListFormat,
    Llama3JsonFormat,
    OpenAIFormat,
    ToolCallFormat,
    get_format,
    list_formats,
)
from slca.chat.maskcheck import MaskMismatch, MaskMismatchError, check_segment_masks, enforce_mask_check

__all__ = [
    "ChatRenderer",
    "ERROR_KINDS",
    "EncodedConversation",
    "HermesFormat",
    "JsonListFormat",
    "Llama3JsonFormat",
    "MaskMismatch",
    "MaskMismatchError",
    "OpenAIFormat",
    "TemplateNotPrefixPreserving",
    "ToolCallFormat",
    "check_segment_masks",
    "encode_conversation",
    "enforce_mask_check",
    "find_training_template",
    "get_format",
    "list_formats",
    "template_messages",
]
